"""The CfC scan's CUDA C kernels (alpha_core.models.cfc_cuda): they compile for an H100/H200 without spilling, and
on a GPU they equal the torch scan (the CUDA half of tests/test_cfc_triton.py) or hand a bf16 scan to Triton."""

from __future__ import annotations

import re

import pytest
import torch

from alpha_core.models import cfc_cuda, nvrtc

FLAGSHIP = [(64, 128), (64, 64)]  # (hidden, backbone units) of the main and aux trunks


def test_lane_layout_is_checked():
    assert cfc_cuda.supported(64, 128, 256) and cfc_cuda.supported(64, 64, 512)
    assert not cfc_cuda.supported(16, 16, 256)  # fewer than four weights per lane
    assert not cfc_cuda.supported(64, 128, 2048)  # over a block's 1024 threads
    assert not cfc_cuda.supported(64, 128, 96)  # lanes do not divide the units


@pytest.mark.parametrize("hidden,units", FLAGSHIP)
def test_scan_kernels_compile_for_sm90_with_weights_in_registers(hidden, units):
    names = list(cfc_cuda.kernel_names(hidden, units, 256))
    cubin, lowered, log = nvrtc.compile_cubin(cfc_cuda.SOURCE, names, "sm_90", ("--ptxas-options=-v",))
    assert cubin and set(lowered) == set(names)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(spills) == 3 and all(s == ("0", "0") for s in spills), log  # a spill re-reads weights every step


def test_a_compile_error_names_the_line():
    with pytest.raises(RuntimeError, match=r"alpha\.cu\(\d+\).*undefined"):
        nvrtc.compile_cubin("__global__ void k() { undefined_name(); }", ["k"], "sm_90")


@pytest.mark.cuda
def test_bf16_scan_takes_the_triton_row_kernel(monkeypatch):
    from alpha_core.models import cfc_triton
    from alpha_core.models.cfc import CfC, parallel_cfc

    monkeypatch.setattr(nvrtc, "_LOADED", {})
    torch.manual_seed(2)
    layers = [CfC(64, h, backbone_units=u).cuda() for h, u in FLAGSHIP]
    xs = [torch.randn(3, 64, 64, device="cuda") for _ in layers]
    ts = [torch.rand(3, 64, device="cuda") for _ in layers]
    assert cfc_triton.LAUNCH_PLAN[0][1] == "cuda"
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        fused = parallel_cfc(layers, xs, ts, fused=True)
        reference = parallel_cfc(layers, xs, ts, fused=False)
    for a, b in zip(fused, reference, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
    assert nvrtc._LOADED == {}


@pytest.fixture
def no_nvrtc(monkeypatch):
    """A machine whose torch brings no NVRTC library."""
    monkeypatch.setattr(nvrtc, "_nvrtc_candidates", lambda: ["/nonexistent/libnvrtc.so.99"])
    nvrtc._nvrtc.cache_clear()
    yield
    nvrtc._nvrtc.cache_clear()


def test_a_missing_nvrtc_is_reported_as_unavailable(no_nvrtc):
    with pytest.raises(nvrtc.NvrtcUnavailable, match="no NVRTC library"):
        nvrtc.compile_cubin("__global__ void k() {}", ["k"], "sm_90")


@pytest.mark.cuda
def test_without_nvrtc_the_scan_warns_once_and_takes_triton(no_nvrtc, monkeypatch):
    from alpha_core.models.cfc import CfC, parallel_cfc

    monkeypatch.setattr(nvrtc, "_LOADED", {})
    monkeypatch.setattr(cfc_cuda.RowScan, "nvrtc_missing", False)
    torch.manual_seed(3)
    layers = [CfC(64, h, backbone_units=u).cuda() for h, u in FLAGSHIP]
    xs = [torch.randn(2, 64, 64, device="cuda") for _ in layers]
    ts = [torch.rand(2, 64, device="cuda") for _ in layers]
    with torch.no_grad(), pytest.warns(UserWarning, match="using the Triton row kernel") as caught:
        fused = parallel_cfc(layers, xs, ts, fused=True)
    assert sum("Triton row kernel" in str(w.message) for w in caught) == 1 and cfc_cuda.RowScan.nvrtc_missing
    with torch.no_grad():
        for a, b in zip(fused, parallel_cfc(layers, xs, ts, fused=False), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_prefetched_scans_are_the_ones_training_loads(monkeypatch):
    """`PerceptionModel.prefetch_kernels` at the flagship's training batch starts both trunks' NVRTC compiles; the
    first training step takes them (nothing left pending, nothing compiled twice) and the scans are right."""
    from alpha_core.models.cfc import parallel_cfc
    from alpha_core.models.perception import PerceptionConfig, PerceptionModel

    monkeypatch.setattr(nvrtc, "_LOADED", {})
    monkeypatch.setattr(nvrtc, "_PENDING", {})
    model = PerceptionModel(PerceptionConfig(n_features=8, horizons=(1, 5), time_scale=1.0)).cuda()
    model.prefetch_kernels(batch=1, dtype=torch.bfloat16)
    assert nvrtc._PENDING == {}  # bf16 scans are Triton's
    model.prefetch_kernels(batch=1, dtype=torch.float32)
    assert len(nvrtc._PENDING) == 2
    layers = [model.trunk, model.aux_trunk]
    xs = [torch.randn(1, 64, 64, device="cuda", requires_grad=True) for _ in layers]
    ts = [torch.rand(1, 64, device="cuda") for _ in layers]
    fused = parallel_cfc(layers, xs, ts, fused=True)
    assert nvrtc._PENDING == {} and len(nvrtc._LOADED) == 2
    with torch.no_grad():
        for a, b in zip(fused, parallel_cfc(layers, xs, ts, fused=False), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
