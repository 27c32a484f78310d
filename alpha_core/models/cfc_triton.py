"""The CfC recurrence fused into one Triton kernel per direction (the flagship's CUDA fast path).

Why: a CfC layer is a chain of L dependent steps. Written in torch, each step is a dozen small kernels forward
and as many backward, so at small batch a training step waits on ~1,000 serial launches even inside a CUDA graph.
Here the forward and the backward of the whole scan are one launch each: a program owns
batch rows and loads the weights once, before its loop over the L steps (re-reading them at every step cost up
to a third more at batch 1); state stays in registers. Shapes of program (`KERNELS`), chosen by batch size from
measurements (`LAUNCH_PLAN`):
- "cuda": at small batch, the hand-written CUDA C kernels of cfc_cuda.py, one block per row (twice as fast as
  "rows" at batch 1 on an H200); they hand what they do not cover (bf16, odd sizes, no NVRTC) to "rows";
- "rows": one row per program, its matrix-vector products as multiply + reduce (exact fp32), every weight tile
  laid out [H, U] so that each product's output is already in the layout of the next one's input;
- "tiles": above, 16 or 32 rows per program with `tl.dot` (tensor cores, TF32 only where torch's own fp32 matmuls
  may, bf16 operands under a bf16 autocast as torch's own matmuls there). The weights sit in shared memory, so bf16
  halves a program's share and more programs fit on the GPU at once (bench/README.md, "The tenth check").
A row kernel with a third of the barriers per step (its loops storing only the state, the rest recomputed over
all steps at once afterwards) and one that loads each step's inputs a step ahead both measured slower at batch 1
on an H200 (bench/README.md, "triton_asm.py"): a row step is not bound by barriers or load latency alone.
Independent layers (the flagship's main and aux trunks) run side by side on their own streams.

The math is exactly `CfCScan`'s (cfc.py): per step, with ts the elapsed time per unit,

    u = tanh(0.666 (xproj_t + W_h h)),  [ff1, ff2, t_a, t_b] = W_heads (1.7159 u) + b_heads,
    g = sigmoid(t_a ts + t_b),          h = tanh(ff1) (1 - g) + g tanh(ff2).

The forward also stores u, tanh(ff1), tanh(ff2), g and t_a for the backward, which walks the steps in reverse
and writes the gradients into xproj (= into the pre-activation), into the four head outputs and into ts. The
weight gradients are then two large GEMMs over all steps in torch, as in `CfCScan`.

Both directions are opaque `torch.library.custom_op`s with a registered autograd formula and fake (meta) kernels,
so the op works under torch.compile and inside a captured CUDA graph. State and arithmetic are fp32 whatever the
input dtype; only the tiles' products take bf16 operands under a bf16 autocast. Under no_grad the forward saves
nothing for a backward.

Limits: H and U powers of two from 16 to 256 (`supported`); otherwise callers take the torch path. Weights
beyond the flagship's sizes (H 64, U 128) no longer fit in registers and spill: correct, slower. Tested on the
CPU through Triton's interpreter (TRITON_INTERPRET=1) against `CfCScan`, values and gradients.
"""

from __future__ import annotations

from functools import partial

import torch
import triton
import triton.language as tl
from torch import Tensor

from alpha_core.models.cfc_cuda import RowScan


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _operand(x, HALF: tl.constexpr):
    """A tile product's operand: bf16 under a bf16 autocast (as torch's own matmuls there), else as it is."""
    return x.to(tl.bfloat16 if HALF else x.dtype)


@triton.jit
def _cfc_fwd_kernel(
    xproj,
    ts,
    w_h,
    w_heads,
    b_heads,
    out,
    u_s,
    f1_s,
    f2_s,
    g_s,
    ta_s,
    B,
    L: tl.constexpr,
    H: tl.constexpr,
    U: tl.constexpr,
    BB: tl.constexpr,
    PRECISION: tl.constexpr,
    HALF: tl.constexpr,
    SAVE: tl.constexpr,
):
    rows = (tl.program_id(0) * BB + tl.arange(0, BB)).to(tl.int64)
    live = rows[:, None] < B
    hh = tl.arange(0, H)
    uu = tl.arange(0, U)
    w_h_t = w_h + uu[None, :] * H + hh[:, None]  # [H, U] view of W_h [U, H], transposed
    w_k = w_heads + hh[None, :] * U + uu[:, None]  # [U, H] view of head k's [H, U] block, transposed (+ k*H*U)
    b1 = tl.load(b_heads + hh)[None, :]
    b2 = tl.load(b_heads + H + hh)[None, :]
    b3 = tl.load(b_heads + 2 * H + hh)[None, :]
    b4 = tl.load(b_heads + 3 * H + hh)[None, :]
    at_u = rows[:, None] * L * U + uu[None, :]
    at_h = rows[:, None] * L * H + hh[None, :]
    wh = _operand(tl.load(w_h_t), HALF)
    w1 = _operand(tl.load(w_k), HALF)
    w2 = _operand(tl.load(w_k + H * U), HALF)
    w3 = _operand(tl.load(w_k + 2 * H * U), HALF)
    w4 = _operand(tl.load(w_k + 3 * H * U), HALF)
    h = tl.zeros([BB, H], dtype=tl.float32)
    for t in range(L):
        x_t = tl.load(xproj + at_u + t * U, mask=live, other=0.0).to(tl.float32)
        u = _tanh(0.666 * (x_t + tl.dot(_operand(h, HALF), wh, input_precision=PRECISION)))
        z = _operand(1.7159 * u, HALF)
        o1 = tl.dot(z, w1, input_precision=PRECISION) + b1
        o2 = tl.dot(z, w2, input_precision=PRECISION) + b2
        ta = tl.dot(z, w3, input_precision=PRECISION) + b3
        tb = tl.dot(z, w4, input_precision=PRECISION) + b4
        ts_t = tl.load(ts + at_h + t * H, mask=live, other=0.0).to(tl.float32)
        g = tl.sigmoid(ta * ts_t + tb)
        f1 = _tanh(o1)
        f2 = _tanh(o2)
        h = f1 * (1.0 - g) + g * f2
        if SAVE:  # what the backward reads; inference skips the traffic
            tl.store(u_s + at_u + t * U, u, mask=live)
            tl.store(f1_s + at_h + t * H, f1, mask=live)
            tl.store(f2_s + at_h + t * H, f2, mask=live)
            tl.store(g_s + at_h + t * H, g, mask=live)
            tl.store(ta_s + at_h + t * H, ta, mask=live)
        tl.store(out + at_h + t * H, h.to(out.dtype.element_ty), mask=live)


@triton.jit
def _cfc_bwd_kernel(
    grad_out,
    ts,
    w_h,
    w_heads,
    u_s,
    f1_s,
    f2_s,
    g_s,
    ta_s,
    d_xproj,
    d_heads,
    d_ts,
    B,
    L: tl.constexpr,
    H: tl.constexpr,
    U: tl.constexpr,
    BB: tl.constexpr,
    PRECISION: tl.constexpr,
    HALF: tl.constexpr,
):
    rows = (tl.program_id(0) * BB + tl.arange(0, BB)).to(tl.int64)
    live = rows[:, None] < B
    hh = tl.arange(0, H)
    uu = tl.arange(0, U)
    w_h_n = w_h + uu[:, None] * H + hh[None, :]  # [U, H]: W_h as stored
    w_k = w_heads + hh[:, None] * U + uu[None, :]  # [H, U]: head k's block as stored (+ k*H*U)
    at_u = rows[:, None] * L * U + uu[None, :]
    at_h = rows[:, None] * L * H + hh[None, :]
    at_o = rows[:, None] * L * 4 * H + hh[None, :]
    wh = _operand(tl.load(w_h_n), HALF)
    w1 = _operand(tl.load(w_k), HALF)
    w2 = _operand(tl.load(w_k + H * U), HALF)
    w3 = _operand(tl.load(w_k + 2 * H * U), HALF)
    w4 = _operand(tl.load(w_k + 3 * H * U), HALF)
    carry = tl.zeros([BB, H], dtype=tl.float32)
    for i in range(L):
        t = L - 1 - i
        gh = tl.load(grad_out + at_h + t * H, mask=live, other=0.0).to(tl.float32) + carry
        f1 = tl.load(f1_s + at_h + t * H, mask=live, other=0.0)
        f2 = tl.load(f2_s + at_h + t * H, mask=live, other=0.0)
        g = tl.load(g_s + at_h + t * H, mask=live, other=0.0)
        ta = tl.load(ta_s + at_h + t * H, mask=live, other=0.0)
        ts_t = tl.load(ts + at_h + t * H, mask=live, other=0.0).to(tl.float32)
        u = tl.load(u_s + at_u + t * U, mask=live, other=0.0)
        d_pre = gh * (f2 - f1) * g * (1.0 - g)
        d1 = gh * (1.0 - g) * (1.0 - f1 * f1)
        d2 = gh * g * (1.0 - f2 * f2)
        d3 = d_pre * ts_t
        tl.store(d_heads + at_o + t * 4 * H, d1, mask=live)
        tl.store(d_heads + at_o + t * 4 * H + H, d2, mask=live)
        tl.store(d_heads + at_o + t * 4 * H + 2 * H, d3, mask=live)
        tl.store(d_heads + at_o + t * 4 * H + 3 * H, d_pre, mask=live)
        tl.store(d_ts + at_h + t * H, d_pre * ta, mask=live)
        d_z = tl.dot(_operand(d1, HALF), w1, input_precision=PRECISION)
        d_z += tl.dot(_operand(d2, HALF), w2, input_precision=PRECISION)
        d_z += tl.dot(_operand(d3, HALF), w3, input_precision=PRECISION)
        d_z += tl.dot(_operand(d_pre, HALF), w4, input_precision=PRECISION)
        d_a = d_z * (1.7159 * 0.666) * (1.0 - u * u)
        tl.store(d_xproj + at_u + t * U, d_a, mask=live)
        carry = tl.dot(_operand(d_a, HALF), wh, input_precision=PRECISION)


@triton.jit
def _cfc_fwd_row_kernel(
    xproj,
    ts,
    w_h,
    w_heads,
    b_heads,
    out,
    u_s,
    f1_s,
    f2_s,
    g_s,
    ta_s,
    B,
    L: tl.constexpr,
    H: tl.constexpr,
    U: tl.constexpr,
    SAVE: tl.constexpr,
):
    """One row per program, weights in registers, and every tile [H, U]: the recurrent product reduces over
    axis 0 and the heads over axis 1, so each product's output is already laid out as the next one's input (no
    layout conversion through shared memory inside the loop)."""
    row = tl.program_id(0).to(tl.int64)
    hh = tl.arange(0, H)
    uu = tl.arange(0, U)
    w_k = w_heads + hh[:, None] * U + uu[None, :]  # head k's [H, U] block as stored (+ k*H*U)
    wh = tl.load(w_h + uu[None, :] * H + hh[:, None])  # [H, U]: W_h transposed
    w1 = tl.load(w_k)
    w2 = tl.load(w_k + H * U)
    w3 = tl.load(w_k + 2 * H * U)
    w4 = tl.load(w_k + 3 * H * U)
    b1 = tl.load(b_heads + hh)
    b2 = tl.load(b_heads + H + hh)
    b3 = tl.load(b_heads + 2 * H + hh)
    b4 = tl.load(b_heads + 3 * H + hh)
    at_u = row * L * U + uu
    at_h = row * L * H + hh
    h = tl.zeros([H], dtype=tl.float32)
    for t in range(L):
        x_t = tl.load(xproj + at_u + t * U).to(tl.float32)
        u = _tanh(0.666 * (x_t + tl.sum(wh * h[:, None], axis=0)))
        z = (1.7159 * u)[None, :]
        o1 = tl.sum(w1 * z, axis=1) + b1
        o2 = tl.sum(w2 * z, axis=1) + b2
        ta = tl.sum(w3 * z, axis=1) + b3
        tb = tl.sum(w4 * z, axis=1) + b4
        g = tl.sigmoid(ta * tl.load(ts + at_h + t * H).to(tl.float32) + tb)
        f1 = _tanh(o1)
        f2 = _tanh(o2)
        h = f1 * (1.0 - g) + g * f2
        if SAVE:
            tl.store(u_s + at_u + t * U, u)
            tl.store(f1_s + at_h + t * H, f1)
            tl.store(f2_s + at_h + t * H, f2)
            tl.store(g_s + at_h + t * H, g)
            tl.store(ta_s + at_h + t * H, ta)
        tl.store(out + at_h + t * H, h.to(out.dtype.element_ty))


@triton.jit
def _cfc_bwd_row_kernel(
    grad_out,
    ts,
    w_h,
    w_heads,
    u_s,
    f1_s,
    f2_s,
    g_s,
    ta_s,
    d_xproj,
    d_heads,
    d_ts,
    B,
    L: tl.constexpr,
    H: tl.constexpr,
    U: tl.constexpr,
):
    """The backward of `_cfc_fwd_row_kernel`, tiles [H, U]: the four head products are summed elementwise
    and reduced once."""
    row = tl.program_id(0).to(tl.int64)
    hh = tl.arange(0, H)
    uu = tl.arange(0, U)
    w_k = w_heads + hh[:, None] * U + uu[None, :]
    wh = tl.load(w_h + uu[None, :] * H + hh[:, None])  # [H, U]: W_h transposed
    w1 = tl.load(w_k)
    w2 = tl.load(w_k + H * U)
    w3 = tl.load(w_k + 2 * H * U)
    w4 = tl.load(w_k + 3 * H * U)
    at_u = row * L * U + uu
    at_h = row * L * H + hh
    at_o = row * L * 4 * H + hh
    carry = tl.zeros([H], dtype=tl.float32)
    for i in range(L):
        t = L - 1 - i
        gh = tl.load(grad_out + at_h + t * H).to(tl.float32) + carry
        f1 = tl.load(f1_s + at_h + t * H)
        f2 = tl.load(f2_s + at_h + t * H)
        g = tl.load(g_s + at_h + t * H)
        d_pre = gh * (f2 - f1) * g * (1.0 - g)
        d1 = gh * (1.0 - g) * (1.0 - f1 * f1)
        d2 = gh * g * (1.0 - f2 * f2)
        d3 = d_pre * tl.load(ts + at_h + t * H).to(tl.float32)
        tl.store(d_heads + at_o + t * 4 * H, d1)
        tl.store(d_heads + at_o + t * 4 * H + H, d2)
        tl.store(d_heads + at_o + t * 4 * H + 2 * H, d3)
        tl.store(d_heads + at_o + t * 4 * H + 3 * H, d_pre)
        tl.store(d_ts + at_h + t * H, d_pre * tl.load(ta_s + at_h + t * H))
        d_z = tl.sum(w1 * d1[:, None] + w2 * d2[:, None] + w3 * d3[:, None] + w4 * d_pre[:, None], axis=0)
        u = tl.load(u_s + at_u + t * U)
        d_a = d_z * (1.7159 * 0.666) * (1.0 - u * u)
        tl.store(d_xproj + at_u + t * U, d_a)
        carry = tl.sum(wh * d_a[None, :], axis=1)


def _pow2(n: int) -> bool:
    return 16 <= n <= 256 and n & (n - 1) == 0


def supported(hidden: int, units: int) -> bool:
    """Whether a layer of this hidden size and backbone width can take the fused path."""
    return _pow2(hidden) and _pow2(units)


KERNELS = {  # name -> (forward kernel, backward kernel, whether a program owns a tile of rows or one row)
    "cuda": (RowScan(False, _cfc_fwd_row_kernel), RowScan(True, _cfc_bwd_row_kernel), False),  # cfc_cuda.py
    "rows": (_cfc_fwd_row_kernel, _cfc_bwd_row_kernel, False),
    "tiles": (_cfc_fwd_kernel, _cfc_bwd_kernel, True),
}
# (largest batch, kernels, rows per tile, warps): the first entry that covers the batch. Measured on an H200 with
# bench/bench_cfc_scan.py, forward + backward of both flagship trunks replayed from a CUDA graph: at batch 1,
# cuda with 8 warps 0.224 ms (16 warps 0.261, Triton rows 0.451, 16-row tiles 0.50); at 64, 0.311 (rows 0.557);
# at 4096, 32-row tiles 3.71 ms (16-row tiles 3.91).
LAUNCH_PLAN: list[tuple[int | None, str, int, int]] = [(64, "cuda", 1, 8), (2048, "tiles", 16, 8), (None, "tiles", 32, 8)]


# Registers per thread of a tile program under bf16: at 128, two programs share a multiprocessor (their bf16 weights
# take ~90 KB of shared memory each), so at B=4096 both trunks' programs run in one wave instead of two; the weight
# fragments the cap spills are re-read from L1 each step (+3% a training step on an H100, bench/README.md)
HALF_TILE_REGISTERS: int | None = 128


def _launch(batch: int, dtype: torch.dtype, backward: bool) -> tuple:
    """(kernel, grid, meta-parameters) for this batch, from `LAUNCH_PLAN`.

    num_stages=1: software pipelining would multi-buffer the weight tiles in shared memory (over 300 KB for the
    main trunk); they are loop-invariant. Tiles use TF32 where torch's own fp32 matmuls may."""
    _, name, rows, warps = next(entry for entry in LAUNCH_PLAN if entry[0] is None or batch <= entry[0])
    forward, backward_kernel, tiled = KERNELS[name]
    kernel = backward_kernel if backward else forward
    if not tiled:
        return kernel, (batch,), {"num_warps": warps, "num_stages": 1}
    tf32 = dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32
    half = dtype == torch.bfloat16
    meta = {"BB": rows, "PRECISION": "tf32" if tf32 else "ieee", "HALF": half, "num_warps": warps, "num_stages": 1}
    if half and HALF_TILE_REGISTERS:
        meta["maxnreg"] = HALF_TILE_REGISTERS
    return kernel, (triton.cdiv(batch, rows),), meta


def prefetch(sizes: list[tuple[int, int]], batch: int, dtype: torch.dtype, device: torch.device) -> None:
    """Start compiling the CUDA C scans that layers of these (hidden, units) sizes will launch at this batch and
    dtype (the "cuda" entry of `LAUNCH_PLAN`, fp32 only), so that a cold process's NVRTC runs beside its
    torch.compile. Triton's kernels compile inside torch.compile's own work and are left to it."""
    kernel, _, meta = _launch(batch, dtype, backward=False)
    if isinstance(kernel, RowScan) and dtype == torch.float32:
        for hidden, units in sizes:
            kernel.prefetch(hidden, units, 32 * meta["num_warps"], device)


_SIDE_STREAMS: dict[tuple[torch.device, int], torch.cuda.Stream] = {}


def _concurrently(launches: list, device: torch.device) -> None:
    """Run independent kernel launches side by side: the first on the current stream, each other one on its own
    side stream forked from it and joined back (a CUDA graph capture records the fork and the join). At small
    batch each scan occupies one multiprocessor, so the layers' scans then cost the time of the longest."""
    if device.type != "cuda" or len(launches) == 1:
        for launch in launches:
            launch()
        return
    current = torch.cuda.current_stream(device)
    sides = [_SIDE_STREAMS.setdefault((device, i), torch.cuda.Stream(device)) for i in range(1, len(launches))]
    for side in sides:
        side.wait_stream(current)
    launches[0]()
    for side, launch in zip(sides, launches[1:], strict=True):
        with torch.cuda.stream(side):
            launch()
    for side in sides:
        current.wait_stream(side)


def _fwd_buffers(xproj: Tensor, w_h: Tensor, save: bool) -> list[Tensor]:
    """states [B, L, H] in xproj's dtype; u [B, L, U]; tanh ff1, tanh ff2, g, t_a [B, L, H] (fp32; empty when
    nothing is saved for a backward)."""
    batch, length, units = xproj.shape
    hidden = w_h.shape[1]
    n = batch * length if save else 0
    f32 = [xproj.new_empty(n, hidden, dtype=torch.float32) for _ in range(4)]
    return [xproj.new_empty(batch, length, hidden), xproj.new_empty(n, units, dtype=torch.float32), *f32]


def _bwd_buffers(u: Tensor, hidden: int) -> list[Tensor]:
    """d_xproj [B, L, U], d_heads [B, L, 4H], d_ts [B, L, H] (fp32); u is [B, L, U]."""
    batch, length, _ = u.shape
    return [torch.empty_like(u), u.new_empty(batch, length, 4 * hidden), u.new_empty(batch, length, hidden)]


N_OUT = 6  # tensors per layer out of the forward: the states, then what the backward reads


@torch.library.custom_op("alpha::cfc_scans_fwd", mutates_args=())
def cfc_scans_fwd(
    xproj: list[Tensor], ts: list[Tensor], w_h: list[Tensor], w_heads: list[Tensor], b_heads: list[Tensor], save: bool
) -> list[Tensor]:
    """Forward scans of independent layers, run concurrently: N_OUT tensors per layer (`_fwd_buffers`)."""
    outs, launches = [], []
    for x, t, wh, wk, bk in zip(xproj, ts, w_h, w_heads, b_heads, strict=True):
        bufs = _fwd_buffers(x, wh, save)
        kernel, grid, meta = _launch(x.shape[0], x.dtype, backward=False)
        launches.append(
            partial(
                kernel[grid], x, t, wh, wk, bk, *bufs, x.shape[0], x.shape[1], H=wh.shape[1], U=x.shape[2], SAVE=save, **meta
            )
        )
        outs += bufs
    _concurrently(launches, xproj[0].device)
    return outs


@cfc_scans_fwd.register_fake
def _(xproj, ts, w_h, w_heads, b_heads, save):
    return [b for x, wh in zip(xproj, w_h, strict=True) for b in _fwd_buffers(x, wh, save)]


@torch.library.custom_op("alpha::cfc_scans_bwd", mutates_args=())
def cfc_scans_bwd(
    grad_out: list[Tensor], ts: list[Tensor], w_h: list[Tensor], w_heads: list[Tensor], saved: list[Tensor]
) -> list[Tensor]:
    """Backward scans, run concurrently; `saved` holds u, tanh ff1, tanh ff2, g, t_a per layer. Returns
    d_xproj, d_heads, d_ts per layer (`_bwd_buffers`)."""
    outs, launches = [], []
    for i, (go, t, wh, wk) in enumerate(zip(grad_out, ts, w_h, w_heads, strict=True)):
        u, f1, f2, g, ta = (a.view(*go.shape[:2], -1) for a in saved[5 * i : 5 * i + 5])
        bufs = _bwd_buffers(u, wh.shape[1])
        kernel, grid, meta = _launch(u.shape[0], go.dtype, backward=True)
        launches.append(
            partial(
                kernel[grid],
                go,
                t,
                wh,
                wk,
                u,
                f1,
                f2,
                g,
                ta,
                *bufs,
                u.shape[0],
                u.shape[1],
                H=wh.shape[1],
                U=u.shape[2],
                **meta,
            )
        )
        outs += bufs
    _concurrently(launches, grad_out[0].device)
    return outs


@cfc_scans_bwd.register_fake
def _(grad_out, ts, w_h, w_heads, saved):
    return [
        b
        for i, (go, wh) in enumerate(zip(grad_out, w_h, strict=True))
        for b in _bwd_buffers(saved[5 * i].view(*go.shape[:2], -1), wh.shape[1])
    ]


def _setup_context(ctx, inputs, output) -> None:
    xproj, ts, w_h, w_heads, b_heads, _ = inputs
    ctx.n = len(xproj)
    ctx.save_for_backward(*ts, *w_h, *w_heads, *output)
    ctx.dtypes = [(x.dtype, t.dtype, b.dtype) for x, t, b in zip(xproj, ts, b_heads, strict=True)]


def _backward(ctx, grads):
    n = ctx.n
    saved = ctx.saved_tensors
    ts, w_h, w_heads, out = saved[:n], saved[n : 2 * n], saved[2 * n : 3 * n], saved[3 * n :]
    states = out[0::N_OUT]
    grad_states = [
        torch.zeros_like(s) if grads[N_OUT * i] is None else grads[N_OUT * i].contiguous() for i, s in enumerate(states)
    ]
    rest = [t for i in range(n) for t in out[N_OUT * i + 1 : N_OUT * (i + 1)]]
    d = cfc_scans_bwd(grad_states, list(ts), list(w_h), list(w_heads), rest)
    result = [[], [], [], [], []]
    for i in range(n):
        d_xproj, d_heads, d_ts = d[3 * i : 3 * i + 3]
        u = out[N_OUT * i + 1].view_as(d_xproj)
        h_prev = torch.cat([torch.zeros_like(states[i][:, :1]), states[i][:, :-1]], dim=1).float()
        x_dtype, ts_dtype, b_dtype = ctx.dtypes[i]
        result[0].append(d_xproj.to(x_dtype))
        result[1].append(d_ts.to(ts_dtype))
        result[2].append((d_xproj.flatten(0, 1).T @ h_prev.flatten(0, 1)).to(w_h[i].dtype))
        result[3].append((d_heads.flatten(0, 1).T @ (1.7159 * u).flatten(0, 1)).to(w_heads[i].dtype))
        result[4].append(d_heads.sum(dim=(0, 1)).to(b_dtype))
    return (*result, None)  # no gradient for `save`


cfc_scans_fwd.register_autograd(_backward, setup_context=_setup_context)


def fused_cfc_scans(
    xproj: list[Tensor], ts: list[Tensor], w_h: list[Tensor], w_heads: list[Tensor], b_heads: list[Tensor]
) -> list[Tensor]:
    """`CfCScan.apply` for independent layers, each one kernel per direction, the layers concurrently.
    Per layer: xproj [B, L, U], ts [B, L, H] (may be a broadcast view), w_h [U, H], w_heads [4H, U], b_heads [4H]
    -> states [B, L, H]. Weights are used in fp32."""
    ts = [t.expand(*x.shape[:2], wh.shape[1]).contiguous() for x, t, wh in zip(xproj, ts, w_h, strict=True)]
    weights = [[w.float().contiguous() for w in ws] for ws in (w_h, w_heads, b_heads)]
    xproj = [x.contiguous() for x in xproj]
    save = torch.is_grad_enabled() and any(t.requires_grad for t in [*xproj, *ts, *(w for ws in weights for w in ws)])
    return cfc_scans_fwd(xproj, ts, *weights, save)[0::N_OUT]
