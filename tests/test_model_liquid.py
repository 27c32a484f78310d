"""Liquid (ncps LTC): one step re-derived from the paper's fused Euler update, causality, learning; its fused
CUDA kernels (alpha_core/models/ltc_triton.py) equal ncps, values and gradients (Triton's interpreter here, the GPU
in the CUDA test set)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
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


@pytest.mark.slow
def test_learns_the_planted_bar_signal(tiny_sidecars):
    bars = tiny_sidecars["bars"]
    aucs = fit_and_score(LiquidModel(LiquidConfig(n_features=13)), bars[:4], [bars[4]], steps=60)
    assert aucs[0] > 0.55, aucs


FUSED_EQUALS_NCPS = textwrap.dedent("""
    import torch
    from alpha_core.models.liquid import LiquidConfig, LiquidModel
    from alpha_core.models.ltc_triton import ltc_states

    # units 7: a padded tile (8); 32: the member's default; 2 unfolds; a batch of one
    for f, units, unfolds, batch, length in [(5, 7, 6, 3, 4), (13, 32, 6, 2, 9), (4, 16, 2, 1, 3)]:
        torch.manual_seed(0)
        model = LiquidModel(LiquidConfig(n_features=f, units=units, ode_unfolds=unfolds))
        cell = model.ltc.rnn_cell
        x = torch.randn(batch, length, f, requires_grad=True)
        reference = model.ltc(x)[0]
        fused = ltc_states(cell, x) * cell.output_w + cell.output_b
        torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-5)
        weights = torch.randn_like(reference)
        inputs = [x, *(p for p in cell.parameters() if p.requires_grad)]
        expected = torch.autograd.grad((reference * weights).sum(), inputs)
        got = torch.autograd.grad((fused * weights).sum(), inputs)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        with torch.no_grad():  # inference: nothing saved for a backward
            torch.testing.assert_close(ltc_states(cell, x) * cell.output_w + cell.output_b, reference,
                                       rtol=1e-5, atol=1e-5)
    print("ok")
""")


@pytest.mark.slow
def test_fused_kernels_equal_ncps_in_the_triton_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # read when the kernels are defined: a fresh interpreter
    done = subprocess.run([sys.executable, "-c", FUSED_EQUALS_NCPS], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]


@pytest.mark.cuda
def test_cuda_equals_ncps_on_the_cpu():
    """The member on CUDA (fused kernels) against ncps on the CPU: outputs, every gradient, and an inference batch
    cut into chunks."""
    import alpha_core.models.liquid as liquid

    torch.manual_seed(4)
    model = LiquidModel(LiquidConfig(n_features=13))
    x = torch.randn(37, 64, 13)
    expected = model(x)
    weights = torch.randn_like(expected)
    (expected * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.cuda()
    got = model(x.cuda())
    (got * weights.cuda()).sum().backward()
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(
            dict(model.named_parameters())[name].grad.cpu(), grad, rtol=1e-3, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}"
        )
    with torch.no_grad():
        whole = model(x.cuda())
        liquid.SENSORY_ELEMENTS, saved = 64 * 13 * 32 * 5, liquid.SENSORY_ELEMENTS  # chunks of 5 rows
        try:
            torch.testing.assert_close(model(x.cuda()), whole, rtol=1e-5, atol=1e-6)
        finally:
            liquid.SENSORY_ELEMENTS = saved
