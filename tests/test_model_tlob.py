"""TLOB: shapes, gradients, serialisation, fp64 oracles for the causal BiN and both attention kinds, causality,
and learning on planted-signal sidecars."""

from __future__ import annotations

import math

import pydantic
import pytest
import torch
import torch.nn.functional as F
from model_harness import assert_causal, fit_and_score
from safetensors.torch import load_model, save_model

from alpha_core.models.tlob import TLOBConfig, TLOBModel


def _model(n_features: int = 7, seed: int = 0, **kw) -> TLOBModel:
    torch.manual_seed(seed)
    return TLOBModel(TLOBConfig(n_features=n_features, **kw))


def test_shapes_loss_and_gradients_reach_every_parameter():
    model = _model(n_heads=2)
    x = torch.randn(3, 11, 7)
    out = model(x)
    assert out.shape == (3, 11, 3)
    loss = F.binary_cross_entropy_with_logits(out, torch.randint(0, 2, out.shape).float())
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_config_forbids_extra_and_validates():
    with pytest.raises(pydantic.ValidationError):
        TLOBConfig(n_features=4, bogus=1)
    with pytest.raises(pydantic.ValidationError):
        TLOBConfig(n_features=4, d_model=0)
    assert TLOBModel(TLOBConfig(n_features=4, horizons=(1,), n_layers=0))(torch.randn(2, 5, 4)).shape == (2, 5, 1)


def test_safetensors_round_trip(tmp_path):
    model = _model()
    model.eval()
    x = torch.randn(2, 9, 7)
    path = tmp_path / "tlob.safetensors"
    save_model(model, str(path))
    other = _model(seed=1)
    other.eval()
    assert not torch.equal(other(x), model(x))
    load_model(other, str(path))
    assert torch.equal(other(x), model(x))


def test_causal_bin_matches_per_position_statistics():
    model = _model().double()
    bin_ = model.bin
    with torch.no_grad():
        for p in bin_.parameters():
            p.copy_(torch.randn_like(p))
    x = torch.randn(2, 10, 7, dtype=torch.float64) * 3 + 5
    eps = bin_.eps
    y1, y2 = F.softplus(bin_.mix_raw)
    expected = torch.empty_like(x)
    for k in range(x.size(1)):
        past = x[:, : k + 1]
        tn = (x[:, k] - past.mean(1)) / torch.sqrt(past.var(1, unbiased=False) + eps) * bin_.gamma_t + bin_.beta_t
        xk = x[:, k]
        fn = (xk - xk.mean(-1, keepdim=True)) / torch.sqrt(xk.var(-1, unbiased=False, keepdim=True) + eps)
        expected[:, k] = y1 * (fn * bin_.gamma_f + bin_.beta_f) + y2 * tn
    torch.testing.assert_close(bin_(x), expected, rtol=1e-9, atol=1e-9)


def _layer_oracle(layer, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """Explicit einsum/softmax recomputation of a post-norm TransformerLayer over axis -2 of x [..., n, w]."""
    h, w, n = layer.n_heads, layer.width, x.size(-2)

    def proj(lin, t):
        return torch.einsum("...nw,ow->...no", t, lin.weight) + lin.bias

    q, k, v = (proj(lin, x).unflatten(-1, (h, w)) for lin in (layer.q, layer.k, layer.v))  # [..., n, h, w]
    scores = torch.einsum("...ihw,...jhw->...hij", q, k) / math.sqrt(w)
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
    att = torch.softmax(scores, dim=-1)
    o = torch.einsum("...hij,...jhw->...ihw", att, v).flatten(-2)
    y = F.layer_norm(x + proj(layer.w0, o), (w,), layer.norm1.weight, layer.norm1.bias, layer.norm1.eps)
    m = proj(layer.fc2, F.gelu(proj(layer.fc1, y)))
    return F.layer_norm(y + m, (w,), layer.norm2.weight, layer.norm2.bias, layer.norm2.eps)


def test_dual_attention_oracle_fp64():
    model = _model(n_heads=2, d_model=12, d_token=5).double().eval()
    torch.manual_seed(3)
    h = torch.randn(2, 9, 12, dtype=torch.float64)
    with torch.no_grad():
        # temporal block: causal attention over the 9 positions, width d_model
        temporal = model.temporal[0]
        torch.testing.assert_close(temporal(h), _layer_oracle(temporal, h, causal=True), rtol=1e-10, atol=1e-10)
        # feature block: per position, the 12 hidden channels are tokens of width d_token, lifted and read back
        feat = model.feature[0]
        u = torch.einsum("bkc,ct->bkct", h, feat.lift_w) + feat.lift_b
        u = _layer_oracle(feat.layer, u, causal=False)
        expected = h + torch.einsum("bkct,ct->bkc", u, feat.read_w) + feat.read_b
        torch.testing.assert_close(feat(h), expected, rtol=1e-10, atol=1e-10)
        # the whole model is the composition of these pieces
        x = torch.randn(2, 9, 7, dtype=torch.float64)
        z = model.embed(model.bin(x))
        pos = torch.arange(9, dtype=torch.float64)[:, None]
        i = torch.arange(0, 12, 2, dtype=torch.float64)
        z = z + torch.stack([torch.sin(pos / 10000 ** (i / 12)), torch.cos(pos / 10000 ** (i / 12))], -1).flatten(-2)
        for t, f in zip(model.temporal, model.feature, strict=True):
            z = f(t(z))
        torch.testing.assert_close(model(x), torch.cat([hd(z) for hd in model.heads], -1), rtol=1e-9, atol=1e-9)


def test_batch_permutation_equivariance():
    model = _model().eval()
    x = torch.randn(5, 8, 7)
    perm = torch.tensor([3, 0, 4, 1, 2])
    with torch.no_grad():
        torch.testing.assert_close(model(x[perm]), model(x)[perm], rtol=1e-5, atol=1e-6)


def test_causal():
    assert_causal(_model(n_heads=2), 7)
    assert_causal(_model(n_features=13), 13, seq_len=32)


@pytest.mark.slow
def test_learns_planted_signal(tiny_sidecars):
    bars = tiny_sidecars["bars"]
    # d_model=16 keeps this ~4 s on one thread; the default d_model=32 scores the same (0.737) in ~8-14 s
    aucs = fit_and_score(_model(n_features=13, d_model=16), bars[:4], [bars[4]])
    print(f"TLOB AUC per horizon: {aucs}")
    assert aucs[0] > 0.55, aucs


@pytest.mark.cuda
def test_cuda_matches_cpu():
    model = _model().eval()
    x = torch.randn(4, 16, 7)
    with torch.no_grad():
        ref = model(x)
        out = model.cuda()(x.cuda())
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    assert_causal(model.cpu(), 7)
