"""In-house KAN (alpha_core.models.kan): B-spline bases against scipy, the layer against an explicit scipy formula,
the causal EMA summary, the sequence model's contract (shapes, gradients, safetensors, causality) and learning."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from model_harness import assert_causal, fit_and_score
from safetensors.torch import load_model, save_model
from scipy.interpolate import BSpline

from alpha_core.models.kan import KANConfig, KANLinear, KANModel, b_spline_bases, extended_grid


@pytest.mark.parametrize(("grid_size", "order", "grid_range"), [(5, 3, (-1.0, 1.0)), (7, 2, (-2.0, 3.0)), (4, 1, (0.0, 1.0))])
def test_bases_match_scipy_design_matrix(grid_size, order, grid_range):
    t = extended_grid(grid_size, order, grid_range)
    assert t.shape == (grid_size + 2 * order + 1,)
    n_bases = grid_size + order
    x = np.concatenate([np.random.default_rng(0).uniform(*grid_range, 2000), np.linspace(*grid_range, 101)])
    ours = b_spline_bases(torch.from_numpy(x)[:, None], t[None], order)[:, 0].numpy()  # [N, G + k]
    assert ours.shape == (x.size, n_bases)
    for j in range(n_bases):  # BSpline(t, e_j, k) is basis function j; inside the base interval = grid_range
        want = BSpline(t.numpy(), np.eye(n_bases)[j], order, extrapolate=False)(x)
        np.testing.assert_allclose(ours[:, j], want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(ours.sum(1), 1.0, rtol=0, atol=1e-13)  # partition of unity on [lo, hi]


def test_bases_match_scipy_basis_element_on_extended_grid():
    """Each basis equals scipy's basis_element on its own k + 2 knots, over the whole extended grid (and 0 outside)."""
    grid_size, order = 5, 3
    t = extended_grid(grid_size, order, (-1.0, 1.0)).numpy()
    x = np.random.default_rng(1).uniform(t[0] - 0.5, t[-1] + 0.5, 4000)
    ours = b_spline_bases(torch.from_numpy(x)[:, None], torch.from_numpy(t)[None], order)[:, 0].numpy()
    for j in range(grid_size + order):
        want = np.nan_to_num(BSpline.basis_element(t[j : j + order + 2], extrapolate=False)(x), nan=0.0)
        np.testing.assert_allclose(ours[:, j], want, rtol=0, atol=1e-13)


def test_kan_linear_matches_explicit_scipy_formula():
    """y_o = sum_i w_base[o,i] silu(x_i) + s[o,i] * BSpline(t, c[o,i], k)(x_i), written out with scipy."""
    torch.manual_seed(0)
    layer = KANLinear(4, 3, grid_size=5, spline_order=3, grid_range=(-1.0, 1.0), scale_noise=1.0).double()
    x = torch.rand(50, 4, dtype=torch.float64) * 2 - 1
    got = layer(x).detach().numpy()
    t = layer.grid[0].numpy()  # the knots as stored (built in float32, then cast by .double())
    np.testing.assert_allclose(t, extended_grid(5, 3, (-1.0, 1.0)).numpy(), rtol=0, atol=1e-6)
    wb, c, s = (p.detach().numpy() for p in (layer.base_weight, layer.spline_weight, layer.spline_scaler))
    xn = x.numpy()
    silu = xn / (1 + np.exp(-xn))
    want = silu @ wb.T
    for o in range(3):
        for i in range(4):
            want[:, o] += s[o, i] * BSpline(t, c[o, i], 3)(xn[:, i])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_causal_ema_is_a_normalised_exponential_mean():
    model = KANModel(KANConfig(n_features=2, ema_half_lives=(1.0, 4.0))).double()
    x = torch.randn(3, 9, 2, dtype=torch.float64)
    got = model.ema(x)  # [B, K, R, F]
    a = torch.sigmoid(model.ema.decay_logit.detach())
    torch.testing.assert_close(a[:, 0], torch.tensor([0.5, 2**-0.25], dtype=torch.float64))
    want = torch.zeros_like(got)
    for r in range(2):
        for f in range(2):
            m, norm = torch.zeros(3, dtype=torch.float64), 0.0
            for k in range(9):  # the recurrence: numerator and weight sum both decay by a each step
                m, norm = a[r, f] * m + x[:, k, f], a[r, f] * norm + 1.0
                want[:, k, r, f] = m / norm
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_config_validation():
    with pytest.raises(ValueError):
        KANConfig(n_features=3, unknown=1)
    with pytest.raises(ValueError, match="grid_range"):
        KANConfig(n_features=3, grid_range=(1.0, -1.0))
    with pytest.raises(ValueError, match="x must be"):
        KANModel(KANConfig(n_features=3))(torch.zeros(2, 4, 5))


def test_shapes_loss_and_gradients_reach_every_parameter():
    torch.manual_seed(0)
    model = KANModel(KANConfig(n_features=13, horizons=(5, 15, 60, 240)))
    x = torch.randn(4, 24, 13)
    out = model(x)
    assert out.shape == (4, 24, 4)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(out, torch.rand_like(out)) + 1e-3 * model.regularization_loss()
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert set(dict(model.named_buffers())) == {"kan1.grid", "kan2.grid"}


def test_safetensors_round_trip(tmp_path):
    torch.manual_seed(0)
    cfg = KANConfig(n_features=5, hidden=8)
    model = KANModel(cfg).eval()
    with torch.no_grad():  # move every parameter off its init so a silent non-load would show
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / "kan.safetensors"
    save_model(model, str(path))
    torch.manual_seed(1)
    other = KANModel(cfg).eval()
    x = torch.randn(2, 10, 5)
    assert not torch.equal(other(x), model(x))
    load_model(other, str(path))
    assert torch.equal(other(x), model(x))


def test_causal():
    torch.manual_seed(0)
    assert_causal(KANModel(KANConfig(n_features=13)), 13)
    assert_causal(KANModel(KANConfig(n_features=3, spline_order=2, grid_size=8, ema_half_lives=(1.0,))), 3, seq_len=40)


@pytest.mark.cuda
def test_cuda_matches_cpu():
    torch.manual_seed(0)
    model = KANModel(KANConfig(n_features=13)).double()
    x = torch.randn(3, 20, 13, dtype=torch.float64)
    want = model(x)
    got = model.cuda()(x.cuda())
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), want, rtol=1e-9, atol=1e-9)
    got.float().sum().backward()
    assert all(p.grad is not None and p.grad.is_cuda for p in model.parameters())


@pytest.mark.slow
def test_learns_planted_signal(tiny_sidecars):
    bars = tiny_sidecars["bars"]
    torch.manual_seed(0)
    n_features = len(bars[0].meta.feature_names)
    assert n_features == 13
    model = KANModel(KANConfig(n_features=n_features, horizons=tuple(bars[0].meta.horizons)))
    start = time.perf_counter()
    aucs = fit_and_score(model, bars[:4], [bars[4]])
    elapsed = time.perf_counter() - start
    print(f"KAN AUC per horizon {[round(a, 3) for a in aucs]} in {elapsed:.1f} s")
    assert aucs[0] > 0.55, aucs
