"""Conditional DDPM: the schedule's closed forms, the sampler, the target, causality, round trip, learning."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_model, save_model
from sklearn.metrics import roc_auc_score

from alpha_core.data.loader import WindowBatch, WindowLoader
from alpha_core.data.norm import fit_norm_stats
from alpha_core.models.diffusion import DiffusionConfig, DiffusionModel, GaussianDiffusion, make_betas

F64 = torch.float64


def reference_betas(n_steps: int, schedule: str) -> torch.Tensor:
    """Betas written out independently of the module (linear scaled by 1000/T, or Nichol & Dhariwal's cosine)."""
    if schedule == "linear":
        return torch.tensor(np.linspace(1e-4 * 1000 / n_steps, 0.02 * 1000 / n_steps, n_steps), dtype=F64)
    f = [math.cos((i / n_steps + 0.008) / 1.008 * math.pi / 2) ** 2 for i in range(n_steps + 1)]
    return torch.tensor([min(1 - f[i + 1] / f[i], 0.999) for i in range(n_steps)], dtype=F64)


def small_model(**kw) -> DiffusionModel:
    return DiffusionModel(DiffusionConfig(n_features=5, n_steps=10, n_samples=8, d_context=8, d_hidden=16, d_time=8, **kw))


def fake_batch(b: int = 3, k: int = 7, h: int = 3, seed: int = 0) -> WindowBatch:
    g = torch.Generator().manual_seed(seed)
    move = torch.randint(-8, 9, (b, k, h), generator=g).float() * 0.25  # price units, whole ticks of 0.25
    cost = 0.5
    labels = (move > 0).float()
    labels[:, -2:, -1] = float("nan")  # the longest horizon runs past the file end
    long_, short = move - cost, -move - cost
    long_[labels.isnan()], short[labels.isnan()] = float("nan"), float("nan")
    return WindowBatch(
        x=torch.randn(b, k, 5, generator=g),
        dt=torch.ones(b, k),
        labels=labels,
        outcome_long=long_,
        outcome_short=short,
        file_index=torch.zeros(b, dtype=torch.long),
        start=torch.zeros(b, dtype=torch.long),
    )


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_forward_noising_matches_the_closed_form(schedule):
    T = 50
    betas = reference_betas(T, schedule)
    torch.testing.assert_close(make_betas(T, schedule), betas, rtol=1e-12, atol=0)
    diff = GaussianDiffusion(betas, dtype=F64)
    abar = torch.cumprod(1 - betas, 0)
    y0 = torch.tensor([1.5, -0.7, 0.2], dtype=F64)
    # analytic: q_sample is sqrt(abar_t) y0 + sqrt(1 - abar_t) eps, for a tensor of steps and for an int step
    g = torch.Generator().manual_seed(0)
    t = torch.randint(0, T, (4, 6), generator=g)
    eps = torch.randn(4, 6, 3, generator=g, dtype=F64)
    expected = abar[t].sqrt()[..., None] * y0 + (1 - abar[t]).sqrt()[..., None] * eps
    torch.testing.assert_close(diff.q_sample(y0.expand(4, 6, 3), t, eps), expected, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(diff.q_sample(y0, 7, eps[0, 0]), abar[7].sqrt() * y0 + (1 - abar[7]).sqrt() * eps[0, 0])
    # empirical: run the Markov chain q(y_s | y_{s-1}) = N(sqrt(1 - beta_s) y_{s-1}, beta_s) up to t and compare moments
    n = 100_000
    y = y0.expand(n, 3).clone()
    for s in range(T):
        y = (1 - betas[s]).sqrt() * y + betas[s].sqrt() * torch.randn(n, 3, generator=g, dtype=F64)
        if s in (0, 9, T - 1):
            jump = diff.q_sample(y0.expand(n, 3), s, torch.randn(n, 3, generator=g, dtype=F64))
            for draws in (y, jump):
                torch.testing.assert_close(draws.mean(0), abar[s].sqrt() * y0, rtol=0, atol=0.012)
                torch.testing.assert_close(draws.var(0), (1 - abar[s]).expand(3), rtol=0.02, atol=2e-5)
    # the model's float32 schedule is the float64 one, rounded
    model = DiffusionModel(DiffusionConfig(n_features=2, n_steps=T, schedule=schedule))
    torch.testing.assert_close(model.diffusion.alphas_cumprod.double(), abar, rtol=1e-6, atol=1e-9)


def test_posterior_matches_the_closed_form_and_bayes_rule():
    T = 40
    betas = reference_betas(T, "linear")
    diff = GaussianDiffusion(betas, dtype=F64)
    alphas = 1 - betas
    abar = torch.cumprod(alphas, 0)
    abar_prev = torch.cat([torch.ones(1, dtype=F64), abar[:-1]])
    g = torch.Generator().manual_seed(1)
    t = torch.randint(0, T, (5, 4), generator=g)
    y0, yt = torch.randn(2, 5, 4, 3, generator=g, dtype=F64)
    mean, var = diff.q_posterior(y0, yt, t)
    b, a, ab, abp = (c[t][..., None] for c in (betas, alphas, abar, abar_prev))
    # DDPM eq. (7)
    closed_mean = abp.sqrt() * b / (1 - ab) * y0 + a.sqrt() * (1 - abp) / (1 - ab) * yt
    closed_var = (1 - abp) / (1 - ab) * b
    torch.testing.assert_close(mean, closed_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(var, closed_var.expand_as(var), rtol=1e-12, atol=1e-14)
    # Bayes: q(y_{t-1} | y_t, y0) ~ N(y_t; sqrt(a) y_{t-1}, b) N(y_{t-1}; sqrt(abp) y0, 1 - abp), for t >= 1
    later = t >= 1
    precision = a / b + 1 / (1 - abp)
    bayes_mean = (a.sqrt() * yt / b + abp.sqrt() * y0 / (1 - abp)) / precision
    torch.testing.assert_close(mean[later], bayes_mean[later], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(var[later], (1 / precision).expand_as(var)[later], rtol=1e-10, atol=1e-12)
    # the last step is deterministic and returns y0
    m0, v0 = diff.q_posterior(y0, yt, 0)
    torch.testing.assert_close(m0, y0, rtol=1e-12, atol=1e-12)
    assert float(v0.abs().max()) == 0.0


def test_sampler_with_the_exact_noise_predictor_recovers_a_gaussian():
    """Data y0 ~ N(mu, s^2): E[eps | y_t] = sqrt(1 - abar) (y_t - sqrt(abar) mu) / v with v = abar s^2 + 1 - abar,
    E[eps_hat^2] = (1 - abar) / v and Var(y0 | y_t) = s^2 (1 - abar) / v. Analytic-DPM's variance is exact here."""
    T = 50
    diff = GaussianDiffusion(make_betas(T, "linear"), dtype=F64)
    mu = torch.tensor([0.8, -0.3, 0.0], dtype=F64)
    s = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    ab = diff.alphas_cumprod[:, None]
    v = ab * s**2 + 1 - ab
    y0_var = diff.y0_variance((1 - ab) / v)
    torch.testing.assert_close(y0_var, s**2 * (1 - ab) / v, rtol=1e-9, atol=1e-12)

    def eps_fn(yt, t):
        return (1 - ab[t]).sqrt() * (yt - ab[t].sqrt() * mu) / v[t]

    g = torch.Generator().manual_seed(2)
    n = 40_000

    def noise():
        return torch.randn(n, 3, generator=g, dtype=F64)

    y = diff.sample(eps_fn, noise(), noise, y0_var=y0_var)
    torch.testing.assert_close(y.mean(0), mu, rtol=0, atol=0.03)
    torch.testing.assert_close(y.std(0), s, rtol=0.02, atol=0)
    # beta-tilde alone (DDPM's lower variance) is too narrow with few steps
    narrow = diff.sample(eps_fn, noise(), noise).std(0)
    assert (narrow < 0.95 * s).all(), narrow


def test_target_mask_and_running_scale():
    model = small_model()
    batch = fake_batch()
    move, mask = model.target(batch, 0.25)
    torch.testing.assert_close(move, torch.where(mask, (batch.outcome_long + 0.5) / 0.25, torch.zeros_like(move)))
    assert torch.equal(mask, batch.labels.isfinite())
    model.train()
    model.loss(batch, 0.25)  # the first update replaces the sqrt(horizon) prior with the batch's mean square
    expected = torch.stack([move[..., j][mask[..., j]].square().mean() for j in range(3)])
    torch.testing.assert_close(model.move_sq, expected)
    assert (model.eps_sq != 1).any() and torch.isfinite(model.eps_sq).all()
    # values under the mask never reach the loss
    model.eval()
    other = fake_batch()
    other.outcome_long[~mask] = 1e6
    torch.manual_seed(3)
    a = model.loss(batch, 0.25)
    torch.manual_seed(3)
    b = model.loss(other, 0.25)
    assert torch.isfinite(a) and torch.equal(a, b)


def test_shapes_gradients_round_trip_determinism_and_causality(tmp_path):
    torch.manual_seed(0)
    model = small_model()
    batch = fake_batch()
    model.train()
    loss = model.loss(batch, 0.25)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    model.eval()
    x = torch.randn(3, 17, 5)
    torch.manual_seed(5)
    out = model(x)
    assert out.shape == (3, 17, 3) and torch.isfinite(out).all()
    assert out.abs().max() <= math.log(2 * 8 + 1) + 1e-5
    # logits are the smoothed fraction of samples above half a tick
    torch.manual_seed(5)
    samples = model.sample_moves(model.encode(x))
    ups = (samples * model.move_scale() > 0.5).sum(0).double()
    torch.testing.assert_close(torch.sigmoid(out.double()), (ups + 0.5) / 9, rtol=1e-5, atol=1e-6)
    # deterministic for a seed, random across seeds; the last-position shortcut and smaller batches agree
    torch.manual_seed(5)
    assert torch.equal(model(x), out)
    torch.manual_seed(6)
    assert not torch.equal(model(x), out)
    torch.manual_seed(5)
    assert torch.equal(model.forward_last(x), out[:, -1])
    torch.manual_seed(5)
    assert torch.equal(model(x[1:2, :9]), out[1:2, :9])
    g = torch.Generator().manual_seed(5)
    assert torch.equal(model(x, generator=g), out)
    # safetensors round trip, including the running scale buffer
    save_model(model, str(tmp_path / "diffusion.safetensors"))
    torch.manual_seed(99)
    again = small_model()
    load_model(again, str(tmp_path / "diffusion.safetensors"))
    assert torch.equal(again.move_sq, model.move_sq) and torch.equal(again.eps_sq, model.eps_sq)
    torch.manual_seed(5)
    torch.testing.assert_close(again(x), out, rtol=0, atol=0)
    # causality: the harness's check, reseeding before every forward since sampling is random
    torch.manual_seed(1)
    x = torch.randn(2, 16, 5)
    with torch.no_grad():
        torch.manual_seed(7)
        base = model(x)
        for t in (0, 8, 15):
            y = x.clone()
            y[:, t:] = torch.randn_like(y[:, t:])
            torch.manual_seed(7)
            torch.testing.assert_close(model(y)[:, :t], base[:, :t], rtol=0, atol=0)


def test_learns_the_planted_bar_signal(tiny_sidecars):
    bars = tiny_sidecars["bars"]
    tick = bars[0].meta.tick_size
    train, val, seq_len = bars[:4], [bars[4]], 32
    torch.manual_seed(0)
    model = DiffusionModel(DiffusionConfig(n_features=13, n_steps=20, n_samples=32))
    norm = fit_norm_stats(train)
    loader = WindowLoader(train, seq_len, 150 * 64, 0, norm)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for epoch in range(2):
        loader.reset(epoch)
        for batch in loader.batches(64, drop_last=True):
            loss = model.loss(batch, tick)
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    batch = WindowLoader(val, seq_len, 4000, 1, norm).next_batch(4000)
    with torch.no_grad():
        torch.manual_seed(0)
        logits = model.forward_last(batch.x)  # == forward(batch.x)[:, -1] for this seed, at 1/seq_len the cost
        torch.manual_seed(0)
        assert torch.equal(model(batch.x[:64])[:, -1], logits[:64])
    p, y = torch.sigmoid(logits).numpy(), batch.labels[:, -1].numpy()
    ok = np.isfinite(y[:, 0])
    auc = roc_auc_score(y[ok, 0], p[ok, 0])
    assert auc > 0.55, auc


def test_evaluation_of_a_sampling_model_is_reproducible():
    """Two `alpha evaluate` runs of one Diffusion checkpoint give the same probabilities, whatever the global RNG."""
    from alpha_core.data.norm import NormStats
    from alpha_core.eval.predict import _window_probs

    model = small_model().eval()
    features = np.random.default_rng(0).normal(size=(300, 5)).astype(np.float32)
    norm = NormStats(feature_names=[f"f{i}" for i in range(5)], mean=[0.0] * 5, std=[1.0] * 5, rows=300, sources=[])
    runs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        runs.append(_window_probs(model, features, None, 16, norm, torch.device("cpu"))[0])
    np.testing.assert_array_equal(runs[0], runs[1])
