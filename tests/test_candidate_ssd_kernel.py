"""The B=4096 candidate (bench/candidate_ssd_kernel.py): the SSD over a whole window in one Triton kernel per
direction computes what `ssd_chunked` computes, values and the gradients of x, dt, A, B and C. On the CPU the
kernels run in Triton's interpreter (TRITON_INTERPRET=1, read when they are defined, hence a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parent.parent

CHECK = textwrap.dedent("""
    import sys
    import torch
    sys.path.insert(0, "bench")
    import candidate_ssd_kernel
    from candidate_ssd_kernel import ssd_window, supported
    from alpha_core.models.mamba2 import ssd_chunked

    torch.manual_seed(0)
    b, k, h, p, g, n = 3, 32, 4, 16, 2, 16  # two groups of two heads: the gradients of B and C sum a group's heads
    x = torch.randn(b, k, h, p, requires_grad=True)
    dt = (torch.rand(b, k, h) * 0.5 + 0.01).requires_grad_()
    A = (-torch.rand(h) * 3 - 0.5).requires_grad_()
    B = torch.randn(b, k, g, n, requires_grad=True)
    C = torch.randn(b, k, g, n, requires_grad=True)
    assert supported(x, B) and not supported(x[:, :20], B[:, :20])
    leaves = [x, dt, A, B, C]
    weights = torch.randn(b, k, h, p)
    reference = ssd_chunked(x, dt, A, B, C, 8)[0]
    g_ref = torch.autograd.grad((reference * weights).sum(), leaves, retain_graph=True)
    for splits in (1, 2):  # a program for both heads of a group, or one a head (their B and C gradients summed)
        candidate_ssd_kernel.PROGRAMS_PER_GROUP = splits
        fused = ssd_window(x, dt, A, B, C)
        torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-4)
        g_fused = torch.autograd.grad((fused * weights).sum(), leaves)
        for name, a, r in zip("x dt A B C".split(), g_fused, g_ref, strict=True):
            torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-3, msg=lambda m, name=name: f"S={splits} d{name}: {m}")
    print("ok")
""")


def test_the_window_kernel_computes_what_ssd_chunked_does():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]
