"""The flagship's AdamW (alpha_core.train.one_launch_adamw): on a GPU its one-launch step equals torch's fused
AdamW, captured in a CUDA graph too, and its state is torch's; off the kernel's terms it is torch's own step."""

from __future__ import annotations

import ctypes
import re

import pytest
import torch

from alpha_core.models import nvrtc
from alpha_core.train import one_launch_adamw
from alpha_core.train.one_launch_adamw import MAX_GROUPS, MAX_TENSORS, PER_BLOCK, OneLaunchAdamW

# sizes across the block size (1,024), an odd one and the flagship's largest (18,944); 70 tensors need two launches
SIZES = [1, 3, 1023, 1024, 1025, 18944, 70000, *range(5, 68)]


def test_kernel_compiles_for_sm90_and_reads_its_batch_in_place():
    names = list(one_launch_adamw.NAMES)
    cubin, lowered, log = nvrtc.compile_cubin(one_launch_adamw.SOURCE, names, "sm_90", ("--ptxas-options=-v",))
    assert cubin and set(lowered) == set(names)
    # a batch indexed from a local copy (3.6 KiB a thread) would be a stack frame: it must read from the parameters
    assert re.search(r"0 bytes stack frame, 0 bytes spill stores", log), log
    assert ctypes.sizeof(one_launch_adamw.Batch) <= 4096  # CUDA's limit for a kernel's parameters


def test_launches_split_at_the_batch_limits_and_cover_every_element():
    groups = [{"lr": torch.tensor(1e-3), "betas": (0.9, 0.999), "weight_decay": 0.01, "eps": 1e-8} for _ in range(10)]
    tensors = [torch.zeros(n) for n in SIZES]
    entries = [(p, p, p, p, torch.zeros(()), i % 3) for i, p in enumerate(tensors)]
    launches = one_launch_adamw.batches(entries, groups)
    assert [b.n_tensors for b, _ in launches] == [MAX_TENSORS, len(SIZES) - MAX_TENSORS]
    for batch, blocks in launches:
        counts = [batch.first_block[t + 1] - batch.first_block[t] for t in range(batch.n_tensors)]
        assert all(c == -(-batch.numel[t] // PER_BLOCK) for t, c in enumerate(counts)) and blocks == sum(counts)
    many = [(p, p, p, p, torch.zeros(()), i) for i, p in enumerate(tensors[:10])]  # ten groups, eight a launch
    assert [b.n_tensors for b, _ in one_launch_adamw.batches(many, groups)] == [MAX_GROUPS, 2]


def _model(device: str, seed: int = 0) -> list[list[torch.nn.Parameter]]:
    generator = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(n, generator=generator).to(device)) for n in SIZES]
    return [params[0::3], params[1::3], params[2::3]]


def _groups(groups, lrs) -> list[dict]:
    return [{"params": ps, "lr": lr, "weight_decay": wd} for ps, lr, wd in zip(groups, lrs, (0.01, 0.0, 0.1), strict=True)]


def _set_grads(groups, step: int, skip: torch.nn.Parameter | None = None) -> None:
    generator = torch.Generator().manual_seed(1000 + step)
    for p in (p for ps in groups for p in ps):
        grad = torch.randn(p.shape, generator=generator).to(p.device)
        p.grad = None if p is skip else grad


def _state(optimizer) -> list[torch.Tensor]:
    return [v.detach().cpu() for s in optimizer.state.values() for v in s.values()]


def test_off_a_gpu_it_is_torch_s_adamw():
    ours, theirs = _model("cpu"), _model("cpu")
    a = OneLaunchAdamW(_groups(ours, (1e-3, 3e-3, 3e-3)))
    b = torch.optim.AdamW(_groups(theirs, (1e-3, 3e-3, 3e-3)))
    for step in range(3):
        _set_grads(ours, step), _set_grads(theirs, step)
        a.step(), b.step()
    assert all(torch.equal(x, y) for x, y in zip(_state(a), _state(b), strict=True))
    assert all(torch.equal(x, y) for x, y in zip(ours[0], theirs[0], strict=True))


@pytest.mark.cuda
def test_one_launch_equals_torch_s_fused_adamw_and_keeps_its_state():
    ours, theirs = _model("cuda"), _model("cuda")
    lrs = [torch.tensor(v, device="cuda") for v in (1e-3, 3e-3, 2e-3)]
    a = OneLaunchAdamW(_groups(ours, lrs), fused=True, capturable=True)
    b = torch.optim.AdamW(_groups(theirs, lrs), fused=True, capturable=True)
    for step in range(12):
        for lr in lrs:
            lr.mul_(0.9)  # a schedule, read from the device
        _set_grads(ours, step, skip=ours[1][2] if step < 2 else None)  # a parameter without a gradient is skipped
        _set_grads(theirs, step, skip=theirs[1][2] if step < 2 else None)
        a.step(), b.step()
    for x, y in zip([p for ps in ours for p in ps], [p for ps in theirs for p in ps], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)
    assert a.state_dict()["state"].keys() == b.state_dict()["state"].keys()
    # the moments to float rounding: torch 2.11's are those of beta2 rounded to float (1e-5 apart after 12 steps)
    for x, y in zip(_state(a), _state(b), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
    c = torch.optim.AdamW(_groups(_model("cuda"), lrs), fused=True, capturable=True)
    c.load_state_dict(a.state_dict())  # a resume reads it as an AdamW's
    assert all(torch.equal(x, y) for x, y in zip(_state(a), _state(c), strict=True))


@pytest.mark.cuda
def test_a_captured_step_replays_what_eager_steps_do():
    lrs = [torch.tensor(v, device="cuda") for v in (1e-3, 3e-3, 2e-3)]
    eager, captured = _model("cuda"), _model("cuda")
    a = OneLaunchAdamW(_groups(eager, lrs), fused=True, capturable=True)
    b = OneLaunchAdamW(_groups(captured, lrs), fused=True, capturable=True)
    _set_grads(eager, 0), _set_grads(captured, 0)
    a.step(), b.step()  # the state exists before the capture, as after the trainer's warm-up steps
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        b.step()
    for step in range(1, 6):
        _set_grads(eager, step)
        generator = torch.Generator().manual_seed(1000 + step)
        for p in (p for ps in captured for p in ps):
            p.grad.copy_(torch.randn(p.shape, generator=generator))  # the graph reads the same gradient buffers
        a.step()
        graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(x, y) for x, y in zip(_state(a), _state(b), strict=True))
    assert all(torch.equal(x, y) for ps, qs in zip(eager, captured, strict=True) for x, y in zip(ps, qs, strict=True))
