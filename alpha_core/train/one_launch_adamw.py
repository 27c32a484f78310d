"""torch's AdamW whose captured CUDA step updates every parameter group in one kernel launch.

Why: at batch 1 the flagship's whole step is one CUDA graph of about 0.30 ms, and torch's fused AdamW took 29 us
of it (H100, 2026-12-07): two launches per parameter group (the step counts, then the update), and an update
kernel that gives each tensor of up to 64K elements to one block, so the largest tensor (19K elements) kept one
multiprocessor busy for 9 us while the others idled. Here one kernel covers every tensor of every group in
blocks of 1,024 elements, after one launch that counts the steps.

The formulas are torch's fused AdamW's (`FusedAdamMathFunctor` in ATen), its scalars in double: on torch 2.11 the
parameters equal torch's to 1e-6 and the moments to float rounding (torch's moments are those of beta2 rounded to
float: 1e-5 apart after 12 steps, tests/test_one_launch_adamw.py). The state is torch's (`step`, `exp_avg`,
`exp_avg_sq` per parameter, the step a float32 tensor on the device), so `state_dict`, `load_state_dict` and a
resume see an AdamW. The kernel takes a step whose every group reads its LR from a float32 CUDA tensor (the
captured step's LR table, `CapturedStep`) and whose parameters are contiguous float32 CUDA tensors; any other step
(a float LR, a CPU tensor, amsgrad, a grad scaler, no NVRTC) is torch's own.
"""

from __future__ import annotations

import ctypes
import warnings

import torch

from alpha_core.models import nvrtc

MAX_TENSORS, MAX_GROUPS = 64, 8  # per launch: the batch is a kernel parameter, under CUDA's 4 KiB for those
THREADS, PER_THREAD = 256, 4
PER_BLOCK = THREADS * PER_THREAD

SOURCE = rf"""
#define MAX_TENSORS {MAX_TENSORS}
#define MAX_GROUPS {MAX_GROUPS}
#define THREADS {THREADS}
#define PER_THREAD {PER_THREAD}

struct AdamWBatch {{  // the tensors of one launch, in order; block b updates elements of the tensor t whose
  float* param[MAX_TENSORS];  // first_block[t] <= b < first_block[t + 1]
  const float* grad[MAX_TENSORS];
  float* exp_avg[MAX_TENSORS];
  float* exp_avg_sq[MAX_TENSORS];
  const float* step[MAX_TENSORS];
  const float* lr[MAX_GROUPS];
  double beta1[MAX_GROUPS];
  double beta2[MAX_GROUPS];
  double weight_decay[MAX_GROUPS];
  double eps[MAX_GROUPS];
  int numel[MAX_TENSORS];
  int group[MAX_TENSORS];
  int first_block[MAX_TENSORS + 1];
  int n_tensors;
}};

// ATen's FusedAdamMathFunctor's formulas: float tensors, double scalars.
__global__ void __launch_bounds__(THREADS) adamw_step(const AdamWBatch b) {{
  int t = 0;
  while (t + 1 < b.n_tensors && b.first_block[t + 1] <= (int)blockIdx.x) ++t;
  const int g = b.group[t];
  const double lr = *b.lr[g], beta1 = b.beta1[g], beta2 = b.beta2[g], weight_decay = b.weight_decay[g];
  const double eps = b.eps[g];
  const float step = *b.step[t];
  const float bias_correction1 = 1 - pow(beta1, (double)step);
  const float bias_correction2_sqrt = sqrt(1 - pow(beta2, (double)step));
  const float step_size = lr / bias_correction1;
  const long long first = (long long)(blockIdx.x - b.first_block[t]) * THREADS * PER_THREAD + threadIdx.x;
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {{
    const long long e = first + k * THREADS;
    if (e >= b.numel[t]) break;
    float param = b.param[t][e], exp_avg = b.exp_avg[t][e], exp_avg_sq = b.exp_avg_sq[t][e];
    const float grad = b.grad[t][e];
    if (weight_decay != 0) param -= lr * weight_decay * param;
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad;
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad;
    const float denom = (sqrtf(exp_avg_sq) / bias_correction2_sqrt) + eps;
    param -= step_size * exp_avg / denom;
    b.param[t][e] = param;
    b.exp_avg[t][e] = exp_avg;
    b.exp_avg_sq[t][e] = exp_avg_sq;
  }}
}}
"""
NAMES = ("adamw_step",)


class Batch(ctypes.Structure):
    """`AdamWBatch` of SOURCE, field for field (passed by value: a captured launch keeps its own copy)."""

    _fields_ = [
        *[(name, ctypes.c_void_p * MAX_TENSORS) for name in ("param", "grad", "exp_avg", "exp_avg_sq", "step")],
        ("lr", ctypes.c_void_p * MAX_GROUPS),
        *[(name, ctypes.c_double * MAX_GROUPS) for name in ("beta1", "beta2", "weight_decay", "eps")],
        ("numel", ctypes.c_int * MAX_TENSORS),
        ("group", ctypes.c_int * MAX_TENSORS),
        ("first_block", ctypes.c_int * (MAX_TENSORS + 1)),
        ("n_tensors", ctypes.c_int),
    ]


def batches(entries: list[tuple], groups: list[dict]) -> list[tuple[Batch, int]]:
    """(batch, blocks) per launch. `entries`: (param, grad, exp_avg, exp_avg_sq, step, group index) in order;
    `groups`: the param groups they index. A new launch starts at MAX_TENSORS tensors or MAX_GROUPS groups."""
    out: list[tuple[Batch, int]] = []
    batch, slots, blocks = None, {}, 0
    for param, grad, exp_avg, exp_avg_sq, step, g in entries:
        if batch is None or batch.n_tensors == MAX_TENSORS or (g not in slots and len(slots) == MAX_GROUPS):
            batch, slots, blocks = Batch(), {}, 0
            out.append((batch, 0))
        if g not in slots:
            slot = slots[g] = len(slots)
            group = groups[g]
            batch.lr[slot] = group["lr"].data_ptr()
            batch.beta1[slot], batch.beta2[slot] = (float(b) for b in group["betas"])
            batch.weight_decay[slot], batch.eps[slot] = float(group["weight_decay"]), float(group["eps"])
        t = batch.n_tensors
        batch.param[t], batch.grad[t], batch.step[t] = param.data_ptr(), grad.data_ptr(), step.data_ptr()
        batch.exp_avg[t], batch.exp_avg_sq[t] = exp_avg.data_ptr(), exp_avg_sq.data_ptr()
        batch.numel[t], batch.group[t], batch.first_block[t] = param.numel(), slots[g], blocks
        blocks += -(-param.numel() // PER_BLOCK)
        batch.first_block[t + 1] = blocks
        batch.n_tensors = t + 1
        out[-1] = (batch, blocks)
    return out


def _fits(group: dict, device: torch.device) -> bool:
    lr = group["lr"]
    return (
        isinstance(lr, torch.Tensor)
        and lr.device == device
        and lr.dtype == torch.float32
        and lr.numel() == 1
        and (group["capturable"] or group["fused"])  # the step counts live on the device
        and not (group["amsgrad"] or group["maximize"] or group["differentiable"])
    )


def _param_fits(p: torch.Tensor, device: torch.device) -> bool:
    g = p.grad
    return (
        p.device == device
        and p.dtype == torch.float32
        and p.is_contiguous()
        and not g.is_sparse
        and g.dtype == torch.float32
        and g.is_contiguous()
        and g.shape == p.shape
    )


class OneLaunchAdamW(torch.optim.AdamW):
    """AdamW (same arguments, state and results) whose eligible CUDA steps are one update kernel (module doc)."""

    nvrtc_missing = False  # set at the first failed load: later steps go straight to torch's

    def __init__(self, params, **kwargs) -> None:
        super().__init__(params, **kwargs)
        devices = {p.device for group in self.param_groups for p in group["params"]}
        if len(devices) == 1 and next(iter(devices)).type == "cuda" and not OneLaunchAdamW.nvrtc_missing:
            nvrtc.prefetch(SOURCE, NAMES, next(iter(devices)))  # compiled while the model is traced, not at step 1

    def _entries(self) -> list[tuple] | None:
        """The update's tensors, state initialised as torch's AdamW does; None where this step is not ours."""
        if OneLaunchAdamW.nvrtc_missing or getattr(self, "grad_scale", None) is not None:
            return None
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not params or params[0].device.type != "cuda":
            return None
        device = params[0].device
        if not all(_fits(group, device) for group in self.param_groups) or not all(_param_fits(p, device) for p in params):
            return None
        entries = []
        for g, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                entries.append((p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"], g))
        return entries

    @torch.no_grad()
    def step(self, closure=None):
        entries = self._entries() if closure is None else None
        if entries is not None:
            try:
                kernel = nvrtc.load(SOURCE, NAMES, entries[0][0].device)["adamw_step"]
            except nvrtc.NvrtcUnavailable as exc:
                warnings.warn(f"AdamW: {exc}; using torch's fused AdamW", stacklevel=2)
                OneLaunchAdamW.nvrtc_missing = True
                entries = None
        if entries is None:
            return super().step(closure)
        torch._foreach_add_([e[4] for e in entries], 1)  # torch's order: count the step, then update with it
        for batch, blocks in batches(entries, self.param_groups):
            kernel(blocks, THREADS, batch)
        return None
