"""The fused Triton CfC scan against the torch scan (`CfCScan`) on a GPU: agreement and time.

    python3 bench/bench_cfc_scan.py [--out bench/out/bench_cfc_scan.json]

For the flagship's two trunks (main: hidden 64, backbone 128; aux: hidden 64, backbone 64) at K=64 it checks
that values and all five gradients agree (fp32, TF32 off), then times forward + backward of both trunks, each
whole pass replayed from a CUDA graph (as in training), at batch 1, 64, 512 and 4096, for the torch scan (both
trunks in one block-diagonal loop, as `parallel_cfc` runs them) and for the fused kernels (the two trunks on
two streams): 16-row tiles and one row per program, at a few warp counts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from alpha_core.models import cfc_triton
from alpha_core.models.cfc import CfC, parallel_cfc

LAYERS = ((64, 128), (64, 64))  # (hidden, backbone units) of the main and aux trunks
D_MODEL, K = 64, 64


def make(batch: int):
    torch.manual_seed(0)
    layers = [CfC(D_MODEL, h, backbone_units=u).cuda() for h, u in LAYERS]
    xs = [torch.randn(batch, K, D_MODEL, device="cuda", requires_grad=True) for _ in layers]
    ts = [torch.rand(batch, K, h, device="cuda", requires_grad=True) for h, _ in LAYERS]
    return layers, xs, ts


def agreement() -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    layers, xs, ts = make(37)
    params = [p for layer in layers for p in layer.parameters()]
    errors = {}
    results = {}
    for fused in (False, True):
        outs = parallel_cfc(layers, xs, ts, fused=fused)
        loss = sum((o * torch.linspace(-1, 1, o.shape[-1], device="cuda")).sum() for o in outs)
        results[fused] = [*outs, *torch.autograd.grad(loss, [*xs, *ts, *params])]
    for i, (a, b) in enumerate(zip(results[False], results[True], strict=True)):
        errors[i] = float((a - b).abs().max().detach() / a.abs().max().detach().clamp_min(1e-12))
    return {"max_relative_error": max(errors.values()), "per_tensor": errors}


def time_pass(batch: int, fused: bool, reps: int = 50) -> float:
    """Milliseconds per forward + backward of both trunks, replayed from a CUDA graph."""
    layers, xs, ts = make(batch)
    params = [p for layer in layers for p in layer.parameters()]

    def step():
        outs = parallel_cfc(layers, xs, ts, fused=fused)
        torch.autograd.grad(sum(o.sum() for o in outs), [*xs, *ts, *params])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


VARIANTS = {  # name -> LAUNCH_PLAN entry for every batch
    **{f"cuda_w{w}": (None, "cuda", 1, w) for w in (4, 8, 16)},
    **{f"rows_w{w}": (None, "rows", 1, w) for w in (4, 8, 16)},
    **{f"tiles{bb}_w{w}": (None, "tiles", bb, w) for bb in (16, 32, 64, 128) for w in (4, 8)},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("bench/out/bench_cfc_scan.json"))
    parser.add_argument("--batches", default="1,64,512,4096")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "agreement": {}}
    default_plan = cfc_triton.LAUNCH_PLAN
    names = args.variants.split(",")
    for name in ["default", *names]:
        cfc_triton.LAUNCH_PLAN = default_plan if name == "default" else [VARIANTS[name]]
        try:
            result["agreement"][name] = agreement()["max_relative_error"]
        except Exception as exc:  # a launch shape that does not fit (registers, shared memory)
            result["agreement"][name] = f"{type(exc).__name__}: {exc}"[:300]
    cfc_triton.LAUNCH_PLAN = default_plan
    print(json.dumps(result["agreement"]), flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True  # as the trainer runs
    timings = []
    for batch in map(int, args.batches.split(",")):
        row = {"batch": batch, "torch_ms": time_pass(batch, fused=False), "fused_default_ms": None}
        for name in names:
            if not cfc_triton.KERNELS[VARIANTS[name][1]][2] and batch > 512:
                continue
            cfc_triton.LAUNCH_PLAN = [VARIANTS[name]]
            try:
                row[f"fused_{name}_ms"] = time_pass(batch, fused=True)
            except Exception as exc:
                row[f"fused_{name}_ms"] = f"{type(exc).__name__}: {exc}"[:300]
        cfc_triton.LAUNCH_PLAN = default_plan
        row["fused_default_ms"] = time_pass(batch, fused=True)
        print(json.dumps(row), flush=True)
        timings.append(row)
    result["timings"] = timings
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
