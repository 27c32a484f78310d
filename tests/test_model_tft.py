"""In-house TFT (alpha_core.models.tft): GRN / interpretable attention oracles in float64, selection weights,
shapes and gradients, safetensors round trip, causality and learning the planted bar signal."""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.nn.functional as F
from model_harness import assert_causal, fit_and_score
from safetensors.torch import load_model, save_model

from alpha_core.models.tft import GRN, InterpretableMultiHeadAttention, TFTConfig, TFTModel, VariableSelectionNetwork


def _randomise(module: torch.nn.Module, seed: int) -> None:
    """Move every parameter off its init (LayerNorm ones/zeros included) so the oracles see generic weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def explicit_grn(sd: dict[str, torch.Tensor], a: torch.Tensor) -> torch.Tensor:
    """GRN(a) = LayerNorm(skip(a) + GLU(W_1 ELU(W_2 a + b_2) + b_1)), one (ungrouped) GRN, written out."""
    z = a @ sd["w2"] + sd["b2"]
    eta2 = torch.where(z > 0, z, torch.exp(z) - 1)
    eta1 = eta2 @ sd["w1"] + sd["b1"]
    glu = eta1 @ sd["w_glu"] + sd["b_glu"]
    d_out = glu.shape[-1] // 2
    gated = glu[..., :d_out] * (1 / (1 + torch.exp(-glu[..., d_out:])))
    skip = a @ sd["w_skip"] + sd["b_skip"] if "w_skip" in sd else a
    y = skip + gated
    mu = y.mean(-1, keepdim=True)
    var = ((y - mu) ** 2).mean(-1, keepdim=True)
    return (y - mu) / torch.sqrt(var + 1e-5) * sd["ln_weight"] + sd["ln_bias"]


@pytest.mark.parametrize("d_in,d_out", [(5, 5), (6, 3)])
def test_grn_matches_equations(d_in, d_out):
    torch.manual_seed(0)
    grn = GRN(d_in, 7, d_out).double()
    _randomise(grn, 1)
    a = torch.randn(4, 9, d_in, dtype=torch.float64)
    assert ("w_skip" in grn.state_dict()) == (d_in != d_out)
    torch.testing.assert_close(grn(a), explicit_grn(grn.state_dict(), a), rtol=0, atol=1e-12)


def test_grouped_grn_is_independent_grns():
    torch.manual_seed(0)
    G, d = 4, 5
    grn = GRN(d, 6, d, n_groups=G).double()
    _randomise(grn, 2)
    a = torch.randn(3, 7, G, d, dtype=torch.float64)
    out = grn(a)
    for g in range(G):
        sd = {k: v[g] for k, v in grn.state_dict().items()}
        torch.testing.assert_close(out[..., g, :], explicit_grn(sd, a[..., g, :]), rtol=0, atol=1e-12)


def test_interpretable_attention_matches_explicit():
    torch.manual_seed(0)
    B, K, d, h = 3, 6, 8, 4
    mha = InterpretableMultiHeadAttention(d, h).double()
    _randomise(mha, 3)
    theta = torch.randn(B, K, d, dtype=torch.float64)
    out, attn = mha(theta)
    sd, dh = mha.state_dict(), d // h
    q = (theta @ sd["q.weight"].T + sd["q.bias"]).reshape(B, K, h, dh)
    k = (theta @ sd["k.weight"].T + sd["k.bias"]).reshape(B, K, h, dh)
    v = theta @ sd["v.weight"].T + sd["v.bias"]  # one value projection, [B, K, dh]
    scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(dh)
    scores = scores + torch.full((K, K), -math.inf, dtype=torch.float64).triu(1)
    want_attn = torch.exp(scores - scores.amax(-1, keepdim=True))
    want_attn = want_attn / want_attn.sum(-1, keepdim=True)
    heads = torch.einsum("bhqk,bke->bhqe", want_attn, v)  # every head reads the same V
    want = heads.mean(1) @ sd["out.weight"].T + sd["out.bias"]
    torch.testing.assert_close(attn, want_attn, rtol=0, atol=1e-12)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(attn.sum(-1), torch.ones(B, h, K, dtype=torch.float64))
    assert (attn.triu(1) == 0).all()


def test_variable_selection_weights_and_mixture():
    torch.manual_seed(0)
    B, K, nf, d = 2, 5, 6, 4
    vsn = VariableSelectionNetwork(nf, d).double()
    _randomise(vsn, 4)
    x = torch.randn(B, K, nf, dtype=torch.float64)
    selected, w = vsn(x)
    assert w.shape == (B, K, nf) and (w > 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(B, K, dtype=torch.float64))
    sd = vsn.state_dict()
    xi = x[..., None] * sd["emb_weight"] + sd["emb_bias"]
    sel = {k.removeprefix("selector."): v for k, v in sd.items() if k.startswith("selector.")}
    torch.testing.assert_close(w, torch.softmax(explicit_grn(sel, xi.reshape(B, K, nf * d)), -1), rtol=0, atol=1e-12)
    grouped = {k.removeprefix("feature_grns."): v for k, v in sd.items() if k.startswith("feature_grns.")}
    want = sum(w[..., j, None] * explicit_grn({k: v[j] for k, v in grouped.items()}, xi[..., j, :]) for j in range(nf))
    torch.testing.assert_close(selected, want, rtol=0, atol=1e-12)


def test_model_keeps_interpretation_weights():
    model = TFTModel(TFTConfig(n_features=13, d_model=16, n_heads=4))
    assert model.last_variable_weights is None and model.last_attention is None
    model(torch.randn(3, 10, 13))
    assert model.last_variable_weights.shape == (3, 10, 13) and not model.last_variable_weights.requires_grad
    assert model.last_attention.shape == (3, 4, 10, 10) and not model.last_attention.requires_grad
    torch.testing.assert_close(model.last_variable_weights.sum(-1), torch.ones(3, 10))
    torch.testing.assert_close(model.last_attention.sum(-1), torch.ones(3, 4, 10))


def test_config_is_strict():
    with pytest.raises(ValueError):
        TFTConfig(n_features=13, d_model=30, n_heads=4)
    with pytest.raises(ValueError):
        TFTConfig(n_features=13, bogus=1)


@pytest.mark.parametrize("lstm_layers", [1, 2])
def test_shapes_gradients_and_round_trip(tmp_path, lstm_layers):
    cfg = TFTConfig(n_features=13, lstm_layers=lstm_layers)
    model = TFTModel(cfg)
    x = torch.randn(4, 21, 13)
    out = model(x)
    assert out.shape == (4, 21, 3)
    loss = F.binary_cross_entropy_with_logits(out, (torch.rand_like(out) > 0.5).float())
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    save_model(model, str(tmp_path / "m.safetensors"))
    again = TFTModel(cfg)
    load_model(again, str(tmp_path / "m.safetensors"))
    torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)


def test_causal():
    assert_causal(TFTModel(TFTConfig(n_features=13)), 13)
    assert_causal(TFTModel(TFTConfig(n_features=5, d_model=8, n_heads=2, lstm_layers=2)), 5, seq_len=9)


@pytest.mark.cuda
def test_cuda_matches_cpu():
    torch.manual_seed(0)
    model = TFTModel(TFTConfig(n_features=13)).eval()
    x = torch.randn(4, 32, 13)
    with torch.no_grad():
        want = model(x)
        got = model.cuda()(x.cuda())
    assert model.last_attention.is_cuda and model.last_variable_weights.is_cuda
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_learns_the_planted_bar_signal(tiny_sidecars):
    bars = tiny_sidecars["bars"]
    torch.manual_seed(0)
    start = time.perf_counter()
    aucs = fit_and_score(TFTModel(TFTConfig(n_features=13)), bars[:4], [bars[4]])
    print(f"TFT AUCs {aucs} in {time.perf_counter() - start:.1f} s")
    assert aucs[0] > 0.55, aucs
