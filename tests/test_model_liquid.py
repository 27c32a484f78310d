"""Liquid (ncps LTC): one step re-derived from the paper's fused Euler update, causality, learning."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from model_harness import assert_causal, fit_and_score
from safetensors.torch import load_model, save_model

from alpha_core.models.liquid import LiquidConfig, LiquidModel


def fused_euler_step(p: dict, x: torch.Tensor, v: torch.Tensor, unfolds: int, eps: float = 1e-8) -> torch.Tensor:
    """LTC (Hasani et al. 2021, eq. 3, fused semi-implicit Euler), elapsed time 1, written from the paper."""
    sp = F.softplus
    x = x * p["input_w"] + p["input_b"]
    sens = sp(p["sensory_w"]) * torch.sigmoid(p["sensory_sigma"] * (x[:, :, None] - p["sensory_mu"]))
    sens = sens * p["sensory_sparsity_mask"]
    num_s, den_s = (sens * p["sensory_erev"]).sum(1), sens.sum(1)
    cm_t = sp(p["cm"]) * unfolds  # C_m / (dt / unfolds) with dt = 1
    for _ in range(unfolds):
        act = sp(p["w"]) * torch.sigmoid(p["sigma"] * (v[:, :, None] - p["mu"])) * p["sparsity_mask"]
        num = cm_t * v + sp(p["gleak"]) * p["vleak"] + (act * p["erev"]).sum(1) + num_s
        den = cm_t + sp(p["gleak"]) + act.sum(1) + den_s
        v = num / (den + eps)
    return v


def test_ltc_step_matches_the_fused_euler_update():
    torch.manual_seed(0)
    model = LiquidModel(LiquidConfig(n_features=5, units=7)).double()
    cell = model.ltc.rnn_cell
    params = {name: value.detach() for name, value in cell.named_parameters()}
    params.update({name: value for name, value in cell.named_buffers()})
    x, v = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)
    expected_state = fused_euler_step(params, x, v, unfolds=6)
    _, state = cell(x, v)
    torch.testing.assert_close(state, expected_state, rtol=1e-12, atol=1e-12)
    outputs, _ = model.ltc(x[:, None, :], v)
    torch.testing.assert_close(outputs[:, 0], expected_state * params["output_w"] + params["output_b"])


def test_shapes_round_trip_and_causality(tmp_path):
    model = LiquidModel(LiquidConfig(n_features=13))
    x = torch.randn(2, 9, 13)
    assert model(x).shape == (2, 9, 3)
    save_model(model, str(tmp_path / "liquid.safetensors"))
    again = LiquidModel(LiquidConfig(n_features=13))
    load_model(again, str(tmp_path / "liquid.safetensors"))
    torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)
    assert_causal(model, 13)


def test_learns_the_planted_bar_signal(tiny_sidecars):
    bars = tiny_sidecars["bars"]
    aucs = fit_and_score(LiquidModel(LiquidConfig(n_features=13)), bars[:4], [bars[4]], steps=60)
    assert aucs[0] > 0.55, aucs
