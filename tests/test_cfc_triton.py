"""The fused Triton CfC scan (alpha_core.models.cfc_triton) equals the torch scan, values and gradients.

On the CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined, hence
a fresh interpreter); on a CUDA machine the compiled kernels are checked too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("triton")

CHECK = textwrap.dedent("""
    import torch
    from alpha_core.models.cfc import CfC
    from alpha_core.models import cfc_triton
    from alpha_core.models.cfc_triton import fused_cfc_scans, supported

    assert supported(64, 128) and supported(16, 16) and not supported(6, 128) and not supported(64, 96)
    for name in cfc_triton.KERNELS:  # every kernel pair, whatever the plan picks
        cfc_triton.LAUNCH_PLAN = [(None, name, 16, 4)]
        torch.manual_seed(0)
        # two layers in one call; batch 19: for tiles a full block of 16 rows and a partly masked one;
        # hidden != units both ways; per-unit and per-sample time steps
        layers = [CfC(8, 16, backbone_units=32), CfC(8, 32, backbone_units=16)]
        xs = [torch.randn(19, 6, 8, requires_grad=True) for _ in layers]
        ts = [torch.rand(19, 6, 16, requires_grad=True), torch.rand(19, 6, 1, requires_grad=True)]
        cells = [layer.rnn_cell for layer in layers]
        heads = [c._head_params() for c in cells]
        fused = fused_cfc_scans([c.input_projection(x) for c, x in zip(cells, xs)], ts,
                                [c._recurrent_weight() for c in cells], [w for w, _ in heads], [b for _, b in heads])
        reference = [layer(x, t)[0] for layer, x, t in zip(layers, xs, ts)]
        for a, b in zip(fused, reference):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-6)
        weights = [torch.randn_like(r) for r in reference]
        inputs = [*xs, *ts, *(p for layer in layers for p in layer.parameters())]
        g_fused = torch.autograd.grad(sum((a * w).sum() for a, w in zip(fused, weights)), inputs)
        g_reference = torch.autograd.grad(sum((b * w).sum() for b, w in zip(reference, weights)), inputs)
        for a, b in zip(g_fused, g_reference, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        with torch.no_grad():  # inference: the kernel skips saving what a backward would read
            for a, b in zip(fused_cfc_scans([c.input_projection(x) for c, x in zip(cells, xs)], ts,
                                            [c._recurrent_weight() for c in cells], [w for w, _ in heads],
                                            [b for _, b in heads]), reference):
                torch.testing.assert_close(a, b, rtol=0, atol=2e-6)
        # a layer whose output feeds nothing still gets (zero) gradients and no error
        first = fused_cfc_scans([c.input_projection(x) for c, x in zip(cells, xs)], ts,
                                [c._recurrent_weight() for c in cells], [w for w, _ in heads], [b for _, b in heads])[0]
        only_first = torch.autograd.grad(first.sum(), xs)
        assert only_first[1].abs().sum() == 0 and only_first[0].abs().sum() > 0
    print("ok")
""")


@pytest.mark.slow
def test_fused_scan_equals_torch_scan_in_the_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 37])
@pytest.mark.parametrize(
    "plan",
    [(None, "cuda", 1, 8), (None, "cuda", 1, 16), (None, "rows", 1, 8), (None, "tiles", 16, 8)],
    ids=["cuda_w8", "cuda_w16", "rows_w8", "tiles16_w8"],
)
def test_fused_scan_equals_torch_scan_on_cuda(monkeypatch, plan, batch):
    from alpha_core.models import cfc_triton, nvrtc
    from alpha_core.models.cfc import CfC, parallel_cfc

    monkeypatch.setattr(cfc_triton, "LAUNCH_PLAN", [plan])
    monkeypatch.setattr(nvrtc, "_LOADED", {})
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1)
    layers = [CfC(64, 64, backbone_units=128).cuda(), CfC(64, 64, backbone_units=64).cuda()]
    xs = [torch.randn(batch, 64, 64, device="cuda", requires_grad=True) for _ in layers]
    ts = [
        torch.rand(batch, 64, 64, device="cuda", requires_grad=True),
        torch.rand(batch, 64, device="cuda", requires_grad=True),
    ]
    inputs = [*xs, *ts, *(p for layer in layers for p in layer.parameters())]
    results = []
    for fused in (False, True):
        outs = parallel_cfc(layers, xs, ts, fused=fused)
        loss = sum((o * torch.linspace(-1, 1, o.shape[-1], device="cuda")).sum() for o in outs)
        results.append([*outs, *torch.autograd.grad(loss, inputs)])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    # the CUDA C kernels ran (both trunks' sizes), not their Triton fallback
    assert len(nvrtc._LOADED) == (2 if plan[1] == "cuda" else 0)


@pytest.mark.cuda
def test_bf16_tiles_follow_the_torch_scan_under_autocast(monkeypatch):
    """Under a bf16 autocast the tiles take bf16 operands (as torch's matmuls do there): values and gradients stay
    within bf16's rounding of the torch scan's under the same autocast."""
    from alpha_core.models import cfc_triton
    from alpha_core.models.cfc import CfC, parallel_cfc

    monkeypatch.setattr(cfc_triton, "LAUNCH_PLAN", [(None, "tiles", 32, 8)])
    torch.manual_seed(2)
    layers = [CfC(64, 64, backbone_units=128).cuda(), CfC(64, 64, backbone_units=64).cuda()]
    xs = [torch.randn(300, 64, 64, device="cuda", requires_grad=True) for _ in layers]
    ts = [torch.rand(300, 64, 64, device="cuda"), torch.rand(300, 64, device="cuda")]
    inputs = [*xs, *(p for layer in layers for p in layer.parameters())]
    results = []
    for fused in (False, True):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outs = parallel_cfc(layers, xs, ts, fused=fused)
            loss = sum((o.float() * torch.linspace(-1, 1, o.shape[-1], device="cuda")).sum() for o in outs)
        results.append([*(o.float() for o in outs), *torch.autograd.grad(loss, inputs)])
    for reference, fused in zip(*results, strict=True):
        assert float((fused - reference).abs().max() / reference.abs().max()) < 0.05
