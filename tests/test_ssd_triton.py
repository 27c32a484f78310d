"""Mamba2's window kernel (alpha_core/models/ssd_triton.py): the SSD over a whole window in one Triton kernel per
direction computes what `ssd_chunked` computes, values and the gradients of x, dt, A, B and C, and the block takes it
exactly where it should. On the CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, read when they are
defined, hence a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from alpha_core.models.mamba2 import Mamba2, Mamba2Config, ssd_chunked, window_kernel

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parent.parent


def window_inputs(device: str, b: int = 3, k: int = 32, h: int = 4, p: int = 16, g: int = 2, n: int = 16):
    """Two groups of two heads by default: the gradients of B and C sum a group's heads."""
    torch.manual_seed(0)
    x = torch.randn(b, k, h, p, device=device, requires_grad=True)
    dt = (torch.rand(b, k, h, device=device) * 0.5 + 0.01).requires_grad_()
    A = (-torch.rand(h, device=device) * 3 - 0.5).requires_grad_()
    B = torch.randn(b, k, g, n, device=device, requires_grad=True)
    C = torch.randn(b, k, g, n, device=device, requires_grad=True)
    return [x, dt, A, B, C]


def assert_kernel_matches_chunked(device: str, rtol: float, atol: float, **sizes) -> None:
    from alpha_core.models.ssd_triton import ssd_window

    leaves = window_inputs(device, **sizes)
    weights = torch.randn_like(leaves[0])
    reference = ssd_chunked(*leaves, 8)[0]
    g_ref = torch.autograd.grad((reference * weights).sum(), leaves)
    fused = ssd_window(*leaves)
    torch.testing.assert_close(fused, reference, rtol=rtol, atol=atol)
    g_fused = torch.autograd.grad((fused * weights).sum(), leaves)
    for name, a, r in zip(["x", "dt", "A", "B", "C"], g_fused, g_ref, strict=True):
        torch.testing.assert_close(a, r, rtol=rtol, atol=10 * atol, msg=lambda m, name=name: f"d{name}: {m}")


def test_the_window_kernel_computes_what_ssd_chunked_does():
    check = textwrap.dedent("""
        import torch
        from alpha_core.models.ssd_triton import supported
        from tests.test_ssd_triton import assert_kernel_matches_chunked, window_inputs

        x, _, _, B, _ = window_inputs("cpu")
        assert supported(x, B) and not supported(x[:, :20], B[:, :20]) and not supported(x.repeat(1, 4, 1, 1), B)
        assert not supported(x.repeat(1, 1, 1, 8), B) and not supported(x, B.repeat(1, 1, 1, 8))  # p, n of 128
        assert_kernel_matches_chunked("cpu", 1e-4, 1e-4)
        print("ok")
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]


def test_the_cpu_keeps_ssd_chunked():
    x, B = torch.empty(65, 64, 4, 16), torch.empty(65, 64, 1, 16)
    assert window_kernel(Mamba2Config(d_model=32, d_state=16), x, B) is None


@pytest.mark.cuda
def test_only_a_large_gpu_batch_with_the_chunk_unset_takes_the_kernel():
    """A configured chunk, a batch of 64 and a window over 64 steps keep `ssd_chunked`."""
    cfg = Mamba2Config(d_model=32, d_state=16)
    x, B = torch.empty(65, 64, 4, 16, device="cuda"), torch.empty(65, 64, 1, 16, device="cuda")
    assert window_kernel(cfg, x, B) is not None
    assert window_kernel(cfg, x[:64], B[:64]) is None
    assert window_kernel(cfg.model_copy(update={"chunk_size": 16}), x, B) is None
    assert window_kernel(cfg, x.repeat(1, 2, 1, 1), B.repeat(1, 2, 1, 1)) is None


@pytest.mark.cuda
@pytest.mark.parametrize("tf32", [False, True])
def test_the_window_kernel_on_a_gpu(tf32):
    """At the flagship's sizes (a window of 64, heads of 16, a state of 16), fp32 and TF32 as torch's matmuls."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        tol = 5e-3 if tf32 else 1e-4
        assert_kernel_matches_chunked("cuda", tol, tol, b=5, k=64, h=8, p=16, g=1, n=16)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


@pytest.mark.cuda
def test_a_large_gpu_batch_takes_the_kernel_and_trains_as_the_cpu_does():
    """A batch of 65 on a GPU routes the block through the kernel; the stack's outputs and parameter gradients match
    the CPU's `ssd_chunked`, and under a bf16 autocast stay close."""
    torch.manual_seed(6)
    cfg = Mamba2Config(d_model=32, d_state=16, n_layers=2)
    model = Mamba2(cfg)
    u = torch.randn(65, 64, 32)
    cpu_out = model(u)
    cpu_out.square().mean().backward()
    cpu_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    gpu = model.to("cuda")
    out = gpu(u.to("cuda"))
    out.square().mean().backward()
    torch.testing.assert_close(out.cpu(), cpu_out, rtol=1e-4, atol=1e-4)
    for a, r in zip((p.grad.cpu() for p in gpu.parameters()), cpu_grads, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-3, atol=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        half = gpu(u.to("cuda")).float().cpu()
    assert (half - cpu_out).abs().max() < 0.05 * cpu_out.abs().max()
