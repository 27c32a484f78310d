"""xLSTM: mLSTM parallel form against its recurrent step form (fp64, outputs and gradients), the sLSTM step against
its (unstabilised) equations, and the model as a causal, trainable, serialisable zoo member."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from model_harness import assert_causal, fit_and_score
from pydantic import ValidationError
from safetensors.torch import load_model, save_model

from alpha_core.models.xlstm import (
    XLSTMConfig,
    XLSTMModel,
    mlstm_parallel,
    mlstm_recurrent,
    slstm_initial_state,
    slstm_step,
)

F64 = torch.float64


def mlstm_inputs(b, nh, length, dh, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, nh, length, dh, generator=gen, dtype=F64) for _ in range(3))
    i_pre = torch.randn(b, nh, length, generator=gen, dtype=F64) * 3  # wide range: the stabiliser matters
    f_pre = torch.randn(b, nh, length, generator=gen, dtype=F64) * 2 + 1
    return q, k, v, i_pre, f_pre


@pytest.mark.parametrize("length", [1, 2, 7, 32, 50])
def test_mlstm_parallel_matches_recurrent(length):
    leaves = [t.requires_grad_() for t in mlstm_inputs(2, 3, length, 4, seed=length)]
    h_par = mlstm_parallel(*leaves)
    h_rec, (C, n, m) = mlstm_recurrent(*leaves)
    assert h_par.shape == h_rec.shape == (2, 3, length, 4) and C.shape == (2, 3, 4, 4) and n.shape == (2, 3, 4)
    torch.testing.assert_close(h_par, h_rec, rtol=0, atol=1e-12)
    w = torch.randn_like(h_par)  # random cotangent: the full vector-Jacobian product
    g_par = torch.autograd.grad((h_par * w).sum(), leaves)
    g_rec = torch.autograd.grad((h_rec * w).sum(), leaves)
    for a, b in zip(g_par, g_rec, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_mlstm_matches_unstabilised_definition():
    """h_t = C*_t q_t / max(|n*_t . q_t|, 1) with C*_t = sum_s exp(F_t - F_s + i_s) v_s k_s^T / sqrt(DH)."""
    q, k, v, i_pre, f_pre = mlstm_inputs(1, 2, 9, 3, seed=5)
    log_f = torch.nn.functional.logsigmoid(f_pre)
    F = log_f.cumsum(-1)
    want = torch.empty_like(q)
    for t in range(9):
        w = torch.exp(F[..., t : t + 1] - F[..., : t + 1] + i_pre[..., : t + 1])  # [B, NH, s]
        C = torch.einsum("bhs,bhsa,bhsc->bhac", w, v[..., : t + 1, :], k[..., : t + 1, :]) / 3**0.5
        n = torch.einsum("bhs,bhsc->bhc", w, k[..., : t + 1, :]) / 3**0.5
        den = (n * q[..., t, :]).sum(-1, keepdim=True).abs().clamp_min(1.0)
        want[..., t, :] = torch.einsum("bhac,bhc->bha", C, q[..., t, :]) / den
    torch.testing.assert_close(mlstm_parallel(q, k, v, i_pre, f_pre), want, rtol=0, atol=1e-12)


def slstm_reference(wx, R, steps):
    """The paper's sLSTM written out without the stabiliser, head by head:
    g~ = W x + R_g h + b;  c = f c + exp(i~) tanh(z~);  n = f n + exp(i~);  h = sigmoid(o~) c / n,  f = sigmoid(f~)."""
    b, _, nh, dh = wx[0].shape
    h = torch.zeros(b, nh, dh, dtype=F64)
    c, n = torch.zeros_like(h), torch.zeros_like(h)
    hs = []
    for t in range(steps):
        raw = wx[t].clone()
        for head in range(nh):
            for gate in range(4):
                raw[:, gate, head] += h[:, head] @ R[head, :, gate, :]
        i_pre, f_pre, z_pre, o_pre = raw[:, 0], raw[:, 1], raw[:, 2], raw[:, 3]
        c = torch.sigmoid(f_pre) * c + torch.exp(i_pre) * torch.tanh(z_pre)
        n = torch.sigmoid(f_pre) * n + torch.exp(i_pre)
        h = torch.sigmoid(o_pre) * c / n
        hs.append(h)
    return hs, c, n


def test_slstm_step_matches_equations():
    gen = torch.Generator().manual_seed(3)
    b, nh, dh, steps = 3, 2, 4, 6
    wx = [torch.randn(b, 4, nh, dh, generator=gen, dtype=F64) * 2 for _ in range(steps)]
    R = torch.randn(nh, dh, 4, dh, generator=gen, dtype=F64) * 0.5
    want_h, want_c, want_n = slstm_reference(wx, R, steps)
    state = slstm_initial_state(b, nh, dh, wx[0])
    for t in range(steps):
        h, state = slstm_step(wx[t], R, state)
        torch.testing.assert_close(h, want_h[t], rtol=0, atol=1e-12)
    _, c, n, m = state
    torch.testing.assert_close(c, want_c * torch.exp(-m), rtol=1e-12, atol=1e-12)  # stabilised = true * exp(-m)
    torch.testing.assert_close(n, want_n * torch.exp(-m), rtol=1e-12, atol=1e-12)


def test_slstm_step_stable_for_extreme_gates():
    wx = torch.tensor([-200.0, 0.0, 1.0, 0.0]).reshape(1, 4, 1, 1).repeat(1, 1, 1, 2)  # i~ = -200 at the first step
    R = torch.zeros(1, 2, 4, 2)
    state = slstm_initial_state(1, 1, 2, wx)
    for _ in range(3):
        h, state = slstm_step(wx, R, state)
        assert torch.isfinite(h).all()
    torch.testing.assert_close(h, torch.full_like(h, 0.5 * torch.tanh(torch.tensor(1.0)).item()))


def test_config_validation():
    with pytest.raises(ValidationError):
        XLSTMConfig(n_features=4, d_model=30, n_heads=4)
    with pytest.raises(ValidationError):
        XLSTMConfig(n_features=4, blocks=("m", "x"))
    with pytest.raises(ValidationError):
        XLSTMConfig(n_features=4, unknown=1)


def test_shapes_loss_and_gradients_reach_every_parameter():
    torch.manual_seed(0)
    model = XLSTMModel(XLSTMConfig(n_features=5, horizons=(5, 15), blocks=("m", "s", "m")))
    x = torch.randn(3, 11, 5)
    logits = model(x)
    assert logits.shape == (3, 11, 2)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.rand_like(logits).round())
    assert torch.isfinite(loss)
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name
    with pytest.raises(ValueError):
        model(torch.randn(3, 11, 4))


def test_causal():
    torch.manual_seed(0)
    assert_causal(XLSTMModel(XLSTMConfig(n_features=6, blocks=("m", "s", "m", "s"))), 6)


def test_safetensors_round_trip(tmp_path):
    cfg = XLSTMConfig(n_features=7)
    torch.manual_seed(0)
    model = XLSTMModel(cfg).eval()
    save_model(model, str(tmp_path / "xlstm.safetensors"))
    torch.manual_seed(1)
    other = XLSTMModel(cfg).eval()
    load_model(other, str(tmp_path / "xlstm.safetensors"))
    x = torch.randn(2, 9, 7)
    with torch.no_grad():
        assert torch.equal(model(x), other(x))


FUSED_EQUALS_LOOP = textwrap.dedent("""
    import torch
    from alpha_core.models.slstm_triton import slstm_scan
    from alpha_core.models.xlstm import XLSTMConfig, XLSTMModel, slstm_loop

    # padded head widths (6, 3), the member's default (4 heads of 8), a batch of one, one bar
    for b, t, nh, dh in [(3, 5, 2, 6), (2, 9, 4, 8), (1, 4, 1, 3), (2, 1, 2, 8)]:
        gen = torch.Generator().manual_seed(1)
        wx = (torch.randn(b, t, 4, nh, dh, generator=gen) * 2).requires_grad_()
        with torch.no_grad():
            wx[:, 0, 0] -= 50  # input gates far below the others at the first bar: the stabiliser matters
        R = (torch.randn(nh, dh, 4, dh, generator=gen) * 0.3).requires_grad_()
        want, want_state = slstm_loop(wx, R)
        got, got_state = slstm_scan(wx, R)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for a, c in zip(got_state, want_state, strict=True):
            torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
        weights = torch.randn(want.shape, generator=gen)
        expected = torch.autograd.grad((want * weights).sum(), (wx, R))
        for a, c in zip(torch.autograd.grad((got * weights).sum(), (wx, R)), expected, strict=True):
            torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
        with torch.no_grad():  # inference: nothing saved for a backward
            torch.testing.assert_close(slstm_scan(wx, R)[0], want, rtol=1e-5, atol=1e-5)
    # the member's own sLSTM layer: its wx through the fused kernels and through its loop
    torch.manual_seed(0)
    layer = XLSTMModel(XLSTMConfig(n_features=6)).blocks[1].cell
    x, xc = torch.randn(2, 16, 32), torch.randn(2, 16, 32)
    wx = torch.cat([layer.w_if(xc), layer.w_zo(x)], dim=-1).reshape(2, 16, 4, layer.n_heads, layer.d_head)
    want = layer(x, xc)[0]
    got = slstm_scan(wx, layer.R)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    grads = [torch.autograd.grad(y.sum(), list(layer.parameters())) for y in (got, want)]
    for a, c in zip(*grads, strict=True):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
    # the once-a-shape check the CUDA path makes: passes against the loop, and a mismatch keeps the loop, with a warning
    import warnings
    from alpha_core.models import slstm_triton
    assert slstm_triton.usable(wx, lambda w, r: slstm_loop(w, r)[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not slstm_triton.usable(wx[:, :8], lambda w, r: slstm_loop(w, r)[0] + 1e-3)
    assert "using the loop" in str(caught[0].message)
    print("ok")
""")


@pytest.mark.slow
def test_fused_slstm_equals_the_loop_in_the_triton_interpreter():
    """The CUDA path's kernels (alpha_core/models/slstm_triton.py), run on the CPU by Triton's interpreter, against
    the loop the member ran before: values, final states and gradients within 1e-5."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # read when the kernels are defined: a fresh interpreter
    done = subprocess.run([sys.executable, "-c", FUSED_EQUALS_LOOP], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("length,heads,width", [(64, 4, 8), (5, 2, 6), (64, 2, 32)])
def test_fused_slstm_kernels_compile_for_sm90_without_spills(length, heads, width):
    """What the interpreter cannot show: the kernels compile for an H100/H200 (Triton's own ptxas, no GPU needed),
    at the member's sizes, a padded head width and the widest head the member sends them, with no local memory."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from alpha_core.models import slstm_triton

    spec = importlib.util.spec_from_file_location("triton_asm", Path(__file__).resolve().parent.parent / "bench/triton_asm.py")
    triton_asm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(triton_asm)
    padded = triton.next_power_of_2(width)
    for kernel, extra in ((slstm_triton._slstm_fwd_kernel, {"SAVE": True}), (slstm_triton._slstm_bwd_kernel, {})):
        given = {"T": length, "NH": heads, "DH": width, "DP": padded, **extra}
        constexprs = {(kernel.arg_names.index(n),): given[n] for n in kernel.arg_names if n in given}
        signature = {n: "constexpr" if n in given else "*fp32" for n in kernel.arg_names}
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": slstm_triton._warps(padded), "num_stages": 1},
        )
        assert triton_asm.resources(compiled.asm["cubin"])["local_bytes"] == 0  # no spills (cuobjdump's count)


@pytest.mark.cuda
def test_cuda_float32_takes_the_fused_slstm_and_equals_the_cpu_loop():
    from alpha_core.models import slstm_triton

    torch.manual_seed(3)
    model = XLSTMModel(XLSTMConfig(n_features=6))
    x = torch.randn(37, 64, 6)
    expected = model(x)
    weights = torch.randn_like(expected)
    (expected * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.cuda()
    got = model(x.cuda())
    (got * weights.cuda()).sum().backward()
    assert slstm_triton._checked.get((got.device, 64, 4, 8)) is True  # the fused kernels ran, not the fallback loop
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad.cpu(), grads[name], rtol=1e-3, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    with torch.no_grad():
        torch.testing.assert_close(model(x.cuda()).cpu(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_the_fused_slstm_passes_its_check_with_tf32_on_as_every_command_runs():
    """`resolve_device` turns TF32 on for every command on CUDA; the kernels' self-check still compares them with
    the exact fp32 loop, so at the trainer's shape (64 bars, 4 heads of 8) they are taken, not the 6x slower loop."""
    from alpha_core.devices import exact_fp32, resolve_device
    from alpha_core.models import slstm_triton
    from alpha_core.models.xlstm import slstm_loop

    with exact_fp32():  # restores the flags after
        device = resolve_device("cuda")
        assert torch.backends.cuda.matmul.allow_tf32
        wx = torch.zeros(2, 64, 4, 4, 8, device=device)
        slstm_triton._checked.pop((wx.device, 64, 4, 8), None)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a failed check warns and keeps the loop
            assert slstm_triton.usable(wx, lambda wx, R: slstm_loop(wx, R)[0])
        assert torch.backends.cuda.matmul.allow_tf32, "the check leaves the command's TF32 setting as it was"


@pytest.mark.cuda
def test_cuda_matches_cpu():
    torch.manual_seed(0)
    model = XLSTMModel(XLSTMConfig(n_features=6)).double().eval()
    x = torch.randn(4, 20, 6, dtype=F64)
    with torch.no_grad():
        want = model(x)
        got = model.cuda()(x.cuda())
    torch.testing.assert_close(got.cpu(), want, rtol=1e-9, atol=1e-9)
    model.float().train()
    loss = model(x.float().cuda()).square().mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.slow
def test_learns_planted_signal(tiny_sidecars):
    torch.manual_seed(0)
    bars = tiny_sidecars["bars"]
    model = XLSTMModel(XLSTMConfig(n_features=13))
    aucs = fit_and_score(model, bars[:4], [bars[4]])
    print(f"xlstm AUC per horizon: {aucs}")
    assert aucs[0] > 0.55, aucs
