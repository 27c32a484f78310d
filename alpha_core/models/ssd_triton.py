"""Mamba2's SSD over a whole window as one Triton kernel per direction: the CUDA path of `Mamba2Block.forward` at a
large batch (`window_kernel` in mamba2.py).

Why: at K <= 64 the window is short enough to take as one chunk. Per sequence and group of heads, the SSD's outputs
are the quadratic form y = (C B^T o L) (dt x), with L[l, s] = exp(cum_l - cum_s) for s <= l (cum the cumulative
log-decay dt A) and 0 above: one [K, N] x [N, K] product, a mask, and one [K, K] x [K, P] product a head, all in
one program. `ssd_chunked` computes the same in ~15 kernels over [4096, 64, ...] activations (150-250 us each at
B=4096 on an H100); with this kernel a flagship training step at B=4096 bf16 went from 478,330 to 575,503 seq/s
(bench/README.md, "The eleventh check"). The backward recomputes the forward's products and writes the gradients
of x, dt, A, B and C. B and C are shared by a group's heads: a program owns a sequence and a group's heads and
sums their gradients over its heads.

Limits (`supported`): K, head dim P and state size N powers of two from 16 to 64 (a backward program then needs at
most 80 KB of shared memory, under the 99 KB of any sm_80+ GPU; at the flagship's 64/16/16, 28 KB); the final state
is not computed (training does not read it; `Mamba2Block.forward_last` keeps `ssd_chunked`). Checked against
`ssd_chunked` in Triton's interpreter on the CPU and on a GPU (tests/test_ssd_triton.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _window(B, C, PRECISION: tl.constexpr, K: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr):
    """This program's sequence and first head, the offsets of its group's B and C, B and C [K, N] (fp32), its
    scores C B^T [K, K] and the window's positions."""
    seq, grp = tl.program_id(0).to(tl.int64), tl.program_id(1)  # 64-bit offsets: a validation batch may be large
    ll = tl.arange(0, K)
    nn = tl.arange(0, N)
    at_bc = seq * K * G * N + ll[:, None] * G * N + grp * N + nn[None, :]
    b = tl.load(B + at_bc).to(tl.float32)
    c = tl.load(C + at_bc).to(tl.float32)
    scores = tl.dot(c, tl.trans(b), input_precision=PRECISION)  # [K, K]: C_l . B_s
    return seq, grp * (H // G), at_bc, b, c, scores, ll


@triton.jit
def _head(x, dt, A, seq, head, ll, K: tl.constexpr, H: tl.constexpr, P: tl.constexpr):
    """One head's inputs: x [K, P] and its offsets, dt [K], A, and its decay mask L [K, K]."""
    pp = tl.arange(0, P)
    at_x = seq * K * H * P + ll[:, None] * H * P + head * P + pp[None, :]
    xs = tl.load(x + at_x).to(tl.float32)
    dts = tl.load(dt + seq * K * H + ll * H + head).to(tl.float32)
    a_h = tl.load(A + head).to(tl.float32)
    cum = tl.cumsum(dts * a_h, 0)
    below = ll[:, None] >= ll[None, :]
    decay = tl.where(below, tl.exp(tl.minimum(cum[:, None] - cum[None, :], 0.0)), 0.0)
    return xs, at_x, dts, a_h, decay


@triton.jit
def _ssd_fwd_kernel(
    x,
    dt,
    A,
    B,
    C,
    y,
    K: tl.constexpr,
    H: tl.constexpr,
    G: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq, first, _, _, _, scores, ll = _window(B, C, PRECISION, K, H, G, N)
    for r in range(H // G):
        xs, at_x, dts, a_h, decay = _head(x, dt, A, seq, first + r, ll, K, H, P)
        out = tl.dot(scores * decay, xs * dts[:, None], input_precision=PRECISION)
        tl.store(y + at_x, out.to(y.dtype.element_ty))


@triton.jit
def _ssd_bwd_kernel(
    x,
    dt,
    A,
    B,
    C,
    dy,
    dx,
    ddt,
    dA,
    dB,
    dC,
    K: tl.constexpr,
    H: tl.constexpr,
    G: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq, first, at_bc, b, c, scores, ll = _window(B, C, PRECISION, K, H, G, N)
    d_scores = tl.zeros([K, K], dtype=tl.float32)
    for r in range(H // G):
        head = first + r
        xs, at_x, dts, a_h, decay = _head(x, dt, A, seq, head, ll, K, H, P)
        g = tl.load(dy + at_x).to(tl.float32)  # [K, P]
        weighted = xs * dts[:, None]
        d_mixed = tl.dot(g, tl.trans(weighted), input_precision=PRECISION)  # [K, K]: d(scores o decay)
        d_weighted = tl.dot(tl.trans(scores * decay), g, input_precision=PRECISION)  # [K, P]
        tl.store(dx + at_x, d_weighted * dts[:, None])
        d_scores += d_mixed * decay
        e = d_mixed * scores * decay  # d(decay) o decay: the gradient of each cum_l - cum_s
        d_cum = tl.sum(e, 1) - tl.sum(e, 0)
        d_a = tl.sum(d_cum, 0) - tl.cumsum(d_cum, 0) + d_cum  # cum is a cumulative sum: sum over t >= s
        tl.store(ddt + seq * K * H + ll * H + head, tl.sum(d_weighted * xs, 1) + d_a * a_h)
        tl.store(dA + seq * H + head, tl.sum(d_a * dts, 0))
    tl.store(dC + at_bc, tl.dot(d_scores, b, input_precision=PRECISION))
    tl.store(dB + at_bc, tl.dot(tl.trans(d_scores), c, input_precision=PRECISION))


def _pow2(n: int) -> bool:
    return 16 <= n <= 64 and n & (n - 1) == 0


def supported(x: Tensor, B: Tensor) -> bool:
    """x [b, K, h, p], B [b, K, g, n]: K, p and n powers of two from 16 to 64."""
    return _pow2(x.shape[1]) and _pow2(x.shape[3]) and _pow2(B.shape[3])


def _launch(x: Tensor, B: Tensor) -> tuple[tuple[int, int], dict]:
    """The grid (sequences, groups) and the meta-parameters. The products use TF32 where torch's own fp32 matmuls
    may."""
    _, k, h, p = x.shape
    tf32 = x.dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32
    meta = {"K": k, "H": h, "G": B.shape[2], "P": p, "N": B.shape[3], "PRECISION": "tf32" if tf32 else "ieee"}
    return (x.shape[0], B.shape[2]), meta


@torch.library.custom_op("alpha::ssd_window", mutates_args=())
def ssd_window(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """`ssd_chunked(x, dt, A, B, C, K)[0]` for a whole window of K steps: y [b, K, h, p] in x's dtype."""
    x, dt, A, B, C = (t.contiguous() for t in (x, dt, A, B, C))
    y = torch.empty_like(x)
    grid, meta = _launch(x, B)
    _ssd_fwd_kernel[grid](x, dt, A, B, C, y, **meta, num_warps=4)
    return y


@ssd_window.register_fake
def _(x, dt, A, B, C):
    return torch.empty_like(x)


@torch.library.custom_op("alpha::ssd_window_bwd", mutates_args=())
def ssd_window_bwd(
    dy: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of x, dt, A, B and C (fp32; A's summed over the batch)."""
    dy, x, dt, A, B, C = (t.contiguous() for t in (dy, x, dt, A, B, C))
    f32 = torch.float32
    dx, ddt = torch.empty_like(x, dtype=f32), torch.empty_like(dt, dtype=f32)
    dA = x.new_empty(x.shape[0], x.shape[2], dtype=f32)
    dB, dC = torch.empty_like(B, dtype=f32), torch.empty_like(C, dtype=f32)
    grid, meta = _launch(x, B)
    _ssd_bwd_kernel[grid](x, dt, A, B, C, dy, dx, ddt, dA, dB, dC, **meta, num_warps=4)
    return dx, ddt, dA.sum(0), dB, dC


@ssd_window_bwd.register_fake
def _(dy, x, dt, A, B, C):
    f32 = torch.float32
    return (
        torch.empty_like(x, dtype=f32),
        torch.empty_like(dt, dtype=f32),
        A.new_empty(A.shape, dtype=f32),
        torch.empty_like(B, dtype=f32),
        torch.empty_like(C, dtype=f32),
    )


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy):
    x, dt, A, B, C = ctx.saved_tensors
    grads = ssd_window_bwd(dy, x, dt, A, B, C)
    return tuple(g.to(t.dtype) for g, t in zip(grads, (x, dt, A, B, C), strict=True))


ssd_window.register_autograd(_backward, setup_context=_setup_context)
