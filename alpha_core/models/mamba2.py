"""Mamba-2 in plain PyTorch: the chunked SSD scan ("Listing 1" of Dao & Gu 2024) and the Mamba-2 block.

The state space model (per head, scalar decay, "SSD")
---------------------------------------------------
Each of ``h`` heads carries a matrix state ``h_t`` of shape ``[p, n]`` (head dim x state dim). With ``dt_t > 0``
(after softplus), ``A < 0`` (one scalar per head) and input/output projections ``B_t, C_t`` of shape ``[n]``::

    h_t = exp(dt_t * A) * h_{t-1} + dt_t * x_t B_t^T          (zero-order-hold decay, Euler input)
    y_t = h_t C_t

Unrolled, ``y_t = sum_{s <= t} exp(a_{s+1} + ... + a_t) * (C_t . B_s) * dt_s x_s`` with ``a_t = dt_t * A``. So the
whole sequence is ``Y = (L o C B^T) X`` with the causal decay mask ``L[t, s] = exp(segsum(a)[t, s])``: a masked
"attention" with a 1-semiseparable mask. The quadratic form costs O(l^2), the recurrence is sequential. SSD splits
the sequence into chunks of ``Q`` steps and mixes both:

1. Intra-chunk (diagonal blocks): the quadratic form inside each chunk, ``Y_diag = (L o C B^T) X``.
2. Chunk states: the state each chunk would produce from a zero start,
   ``S_c = sum_s exp(a_{s+1} + ... + a_end) B_s (dt_s x_s)^T``.
3. Inter-chunk recurrence: a scan over only ``l / Q`` chunk states, written again as a (tiny) segsum-masked
   matmul, seeded by ``initial_state``. Its last entry is the final state.
4. State to output (off-diagonal blocks): the state entering each chunk decays to each position and is read out,
   ``Y_off[t] = exp(a_first + ... + a_t) * h_in C_t``.

``y = Y_diag + Y_off``. Every step is an einsum or a cumsum: no Python loop over time, no data-dependent control
flow, static shapes. Everything exponentiated is a sum of non-positive terms, so no overflow. ``B`` and ``C`` are
shared by groups of heads (``n_groups``, like grouped-query attention); head ``i`` uses group ``i // (h // g)``.
On a GPU at a large batch a window of up to 64 steps is one chunk, the quadratic form alone, in one Triton kernel
per direction (`ssd_triton.py`).

The block (Mamba-2, as in state-spaces/mamba ``Mamba2`` with its defaults)
-------------------------------------------------------------------------
``in_proj`` maps ``u`` to ``[z, xBC, dt]``; a causal depthwise conv1d (+ SiLU) runs over ``xBC``, which is split into
``x`` (heads), ``B`` and ``C``; ``dt = softplus(dt + dt_bias)``, ``A = -exp(A_log)``; ``y = SSD(x, dt, A, B, C) + D x``;
a gated RMSNorm ``rmsnorm(y * silu(z))``; ``out_proj``. The stack ``Mamba2`` is pre-norm residual with a final norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pydantic
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from alpha_core.bounds import Dim, Layers

# --------------------------------------------------------------------------------------------- SSD scan


def segsum(x: Tensor) -> Tensor:
    """Stable segment sum: ``out[..., i, j] = x[..., j+1] + ... + x[..., i]`` for ``i >= j`` (0 on the diagonal),
    ``-inf`` above it, so ``exp(segsum(a))`` is the causal decay mask. ``x [..., T] -> [..., T, T]``.

    Masks, then cumsums, instead of differencing two cumsums (which cancels catastrophically for long chunks).
    """
    T = x.size(-1)
    x = x.unsqueeze(-1).expand(*x.shape, T)  # x[..., i, j] = x_i
    strictly_lower = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)
    x = x.masked_fill(~strictly_lower, 0)  # keep x_i only where i > j
    out = x.cumsum(dim=-2)  # out[i, j] = sum_{j < k <= i} x_k
    lower = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(0)
    return out.masked_fill(~lower, -torch.inf)


def broadcast_einsum(spec: str, x: Tensor, y: Tensor) -> Tensor:
    """`torch.einsum(spec, x, y)` for two operands as a broadcast product and a sum, not a (batched) matmul.

    Why: where a contraction is tiny (a handful of terms, or a whole batch of 1), a matmul is one more kernel
    launch, often behind a transposed copy, while a product and a sum fuse into the ops around it under
    torch.compile (bench/README.md, "The tenth check")."""
    operands, out = spec.split("->")
    first, second = operands.split(",")
    letters = out + "".join(sorted(set(first + second) - set(out)))  # the output's indices, then the summed ones

    def aligned(t: Tensor, indices: str) -> Tensor:
        order = [ch for ch in letters if ch in indices]
        t = t.permute([indices.index(ch) for ch in order])
        return t.reshape([t.shape[order.index(ch)] if ch in indices else 1 for ch in letters])

    product = aligned(x, first) * aligned(y, second)
    return product.sum(dim=tuple(range(len(out), len(letters)))) if len(letters) > len(out) else product


def ssd_chunked(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    initial_state: Tensor | None = None,
    outputs: bool = True,
    broadcast: bool = False,
) -> tuple[Tensor | None, Tensor]:
    """x [b, l, h, p], dt [b, l, h] (positive, after softplus), A [h] (negative), B, C [b, l, g, n] (h % g == 0).
    Discretisation: state h_t = exp(dt_t*A) h_{t-1} + dt_t * x_t B_t^T ; y_t = C_t h_t.  Returns y [b, l, h, p],
    final_state [b, h, p, n] (`outputs` False: y is None, and only the state is computed). Any l: pad internally to
    a multiple of chunk_size (padding must not change results). `broadcast`: every product as `broadcast_einsum`
    (for a small batch on a GPU), else as matmuls, except the pass over chunks, a broadcast on any GPU.

    Padding appends steps with ``dt = 0``: decay ``exp(0) = 1`` and input ``0 * x = 0``, so the state passes through
    unchanged and the final state is the one after step ``l``; outputs of real steps never see later steps.
    Index names in the einsums: b batch, c chunk, l/s position in chunk (target/source), g group,
    r head within group, p head dim, n state dim, z chunk (target of the inter-chunk scan).
    """
    b, seqlen, h, p = x.shape
    g, n = B.shape[-2], B.shape[-1]
    r = h // g
    assert h == g * r, f"heads {h} not divisible by groups {g}"
    pad = (-seqlen) % chunk_size  # Python int from static shapes
    if pad:
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    c, Q = (seqlen + pad) // chunk_size, chunk_size

    X = (x * dt.unsqueeze(-1)).reshape(b, c, Q, g, r, p)  # dt-weighted input
    a = (dt * A).reshape(b, c, Q, g, r).permute(0, 3, 4, 1, 2)  # log-decay per step, [b, g, r, c, Q]
    B = B.reshape(b, c, Q, g, n)
    C = C.reshape(b, c, Q, g, n)
    a_cumsum = a.cumsum(dim=-1)  # within each chunk

    # 2. state of each chunk from a zero start: S_c = sum_s exp(a_{s+1..end}) B_s X_s^T
    decay_to_end = torch.exp(a_cumsum[..., -1:] - a_cumsum).permute(0, 3, 4, 1, 2)  # [b, c, Q, g, r]
    einsum = broadcast_einsum if broadcast else torch.einsum
    states = einsum("bcsgn,bcsgrp->bcgrpn", B, X * decay_to_end.unsqueeze(-1))

    # 3. inter-chunk recurrence over chunk boundaries, seeded by initial_state (a (c+1)x(c+1) segsum matmul)
    if initial_state is None:
        init = torch.zeros_like(states[:, :1])
    else:
        init = initial_state.reshape(b, 1, g, r, p, n).to(states.dtype)
    states = torch.cat([init, states], dim=1)  # [b, c+1, g, r, p, n]
    # over c+1 (2 to 5) chunks a matmul is of tiny matrices: on a GPU a broadcast makes a training step 8% faster at
    # B=4096 and 3% at B=1; on the CPU the matmul is the faster (Mamba2's step at batch 64-256: 25% less)
    decay_chunk = torch.exp(segsum(F.pad(a_cumsum[..., -1], (1, 0))))  # [b, g, r, z = c+1, c+1]
    chunk_pass = broadcast_einsum if x.is_cuda else einsum
    states = chunk_pass("bgrzc,bcgrpn->bzgrpn", decay_chunk, states)
    states, final_state = states[:, :-1], states[:, -1]  # state entering each chunk; state after the last step
    if not outputs:
        return None, final_state.reshape(b, h, p, n)

    # 1. intra-chunk (diagonal blocks): Y_diag[l] = sum_{s <= l} exp(a_{s+1..l}) (C_l . B_s) X_s
    L = torch.exp(segsum(a))  # [b, g, r, c, Q, Q]
    CB = einsum("bclgn,bcsgn->bgcls", C, B)  # shared by the heads of a group
    Y_diag = einsum("bgrcls,bcsgrp->bclgrp", CB.unsqueeze(2) * L, X)

    # 4. state -> output (off-diagonal blocks): Y_off[l] = exp(a_{first..l}) C_l . h_in
    decay_from_start = torch.exp(a_cumsum).permute(0, 3, 4, 1, 2)  # [b, c, Q, g, r]
    Y_off = einsum("bclgn,bcgrpn->bclgrp", C, states) * decay_from_start.unsqueeze(-1)

    y = (Y_diag + Y_off).reshape(b, c * Q, h, p)[:, :seqlen]
    return y, final_state.reshape(b, h, p, n)


def causal_depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``nn.Conv1d(C, C, k, groups=C, padding=k-1)`` over time, keeping the first L outputs, on x [b, l, C] as
    a sum of k shifted products: ``y[t] = bias + sum_j weight[:, 0, j] * x[t - (k-1) + j]``.

    Why not the Conv1d: it needs [b, C, l], so two transposed copies, and its depthwise kernels are slow; here
    the whole conv (and its backward) is elementwise work that torch.compile fuses (1.5 ms of an 11.7 ms step
    at batch 4096 on an H200, bench/bench_train_gpu.py --profile)."""
    k, seqlen = weight.shape[-1], x.shape[1]
    padded = F.pad(x, (0, 0, k - 1, 0))
    w = weight.squeeze(1).T  # [k, C]
    out = padded[:, k - 1 :] * w[k - 1] + bias
    for j in range(k - 1):
        out = out + padded[:, j : j + seqlen] * w[j]
    return out


# --------------------------------------------------------------------------------------------- modules


class Mamba2Config(pydantic.BaseModel, extra="forbid"):
    d_model: Dim = 64  # residual stream width
    d_state: Dim = 16  # n: SSM state size per head row
    d_head: Dim = 16  # p: head dim; n_heads = expand * d_model / d_head
    expand: Dim = 2  # d_inner = expand * d_model
    d_conv: Dim = 4  # causal depthwise conv kernel width
    n_groups: Dim = 1  # g: B/C shared by n_heads / n_groups heads
    # SSD chunk length Q (any sequence length works; it is padded); None: `window_kernel`, else `chunk_length`
    chunk_size: Dim | None = None
    n_layers: Layers = 1

    @pydantic.model_validator(mode="after")
    def _check(self) -> Mamba2Config:
        d_inner = self.expand * self.d_model
        if d_inner % self.d_head:
            raise ValueError(f"expand * d_model = {d_inner} not divisible by d_head = {self.d_head}")
        if (d_inner // self.d_head) % self.n_groups:
            raise ValueError(f"n_heads = {d_inner // self.d_head} not divisible by n_groups = {self.n_groups}")
        if min(self.d_model, self.d_state, self.d_head, self.expand, self.d_conv, self.n_groups, self.chunk_size or 1) < 1:
            raise ValueError("all sizes must be >= 1")
        if self.n_layers < 0:
            raise ValueError("n_layers must be >= 0")
        return self

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def n_heads(self) -> int:
        return self.d_inner // self.d_head


GPU_LARGE_BATCH = 64  # above it, on a GPU, the SSD takes the window kernel or chunks of 32; up to it, broadcasts


def chunk_length(cfg: Mamba2Config, u: Tensor) -> int:
    """The SSD's chunk length for the block input u [b, l, d_model]: the configured one, else 16, and 32 for a batch
    above 64 on a GPU.

    Every chunk length computes the same function (to float rounding); it only moves work between the Q x Q block
    products and the pass over chunks. On a CPU a longer chunk is FLOP-bound and slower (Q=64: 2.6x); on an H100 at
    batch 4096 Q=32 makes a training step 11% faster, at batch 1 it gains nothing (bench/README.md, "The tenth
    check")."""
    if cfg.chunk_size is not None:
        return cfg.chunk_size
    return 32 if u.is_cuda and u.shape[0] > GPU_LARGE_BATCH else 16


def window_kernel(cfg: Mamba2Config, x: Tensor, B: Tensor) -> Callable[..., Tensor] | None:
    """`ssd_triton.ssd_window` where the block's SSD outputs take it, else None: a chunk left unset, a batch above
    64 on a GPU, and window and head sizes the kernel supports. It computes `ssd_chunked`'s outputs (to float
    rounding) in one kernel per direction, 20% faster a flagship training step at B=4096 bf16 on an H100; at B=1 it
    gains nothing over the broadcasts (bench/README.md, "The eleventh check")."""
    if cfg.chunk_size is not None or not x.is_cuda or x.shape[0] <= GPU_LARGE_BATCH:
        return None
    try:
        from alpha_core.models import ssd_triton
    except ImportError:  # no triton in this environment
        return None
    return ssd_triton.ssd_window if ssd_triton.supported(x, B) else None


def broadcast_products(u: Tensor) -> bool:
    """Whether the SSD's products on block input u are broadcasts (`broadcast_einsum`): for a batch up to 64 on a
    GPU, where each matmul would be a launch of its own (bench/README.md, "The tenth check")."""
    return u.is_cuda and u.shape[0] <= GPU_LARGE_BATCH


class Mamba2Block(nn.Module):
    """One Mamba-2 mixer: [B, L, d_model] -> [B, L, d_model]. Causal in L."""

    def __init__(self, cfg: Mamba2Config, dt_min: float = 1e-3, dt_max: float = 1e-1, dt_floor: float = 1e-4):
        super().__init__()
        self.cfg = cfg
        d_inner, n_heads, gn = cfg.d_inner, cfg.n_heads, cfg.n_groups * cfg.d_state
        self.conv_dim = d_inner + 2 * gn  # conv runs over x, B and C
        self.in_proj = nn.Linear(cfg.d_model, 2 * d_inner + 2 * gn + n_heads, bias=False)  # -> z, xBC, dt
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.d_conv, groups=self.conv_dim, padding=cfg.d_conv - 1)
        # dt_bias: softplus(dt_bias) ~ log-uniform on [dt_min, dt_max]; store its inverse softplus
        dt = torch.exp(torch.rand(n_heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=dt_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.empty(n_heads).uniform_(1, 16)))  # A = -exp(A_log) in [-16, -1]
        self.D = nn.Parameter(torch.ones(n_heads))  # skip connection y += D * x
        for param in (self.dt_bias, self.A_log, self.D):
            param._no_weight_decay = True  # convention of state-spaces/mamba: optimizers may exclude these
        self.norm = nn.RMSNorm(d_inner, eps=1e-5)  # gated: norm(y * silu(z))
        self.out_proj = nn.Linear(d_inner, cfg.d_model, bias=False)

    def forward(self, u: Tensor) -> Tensor:  # u [B, L, d_model] -> [B, L, d_model]
        cfg = self.cfg
        batch, seqlen, _ = u.shape
        z, x, dt, A, B, C = self._inputs(u)
        kernel = window_kernel(cfg, x, B)
        if kernel is not None:
            y = kernel(x, dt, A, B, C)
        else:
            y, _ = ssd_chunked(x, dt, A, B, C, chunk_length(cfg, u), broadcast=broadcast_products(u))
        y = y + x * self.D.unsqueeze(-1)
        y = self.norm(y.reshape(batch, seqlen, cfg.d_inner) * F.silu(z))
        return self.out_proj(y)

    def forward_last(self, u: Tensor) -> Tensor:  # u [B, L, d_model] -> [B, 1, d_model]
        """`forward(u)[:, -1:]` (inference): the output at the last position is C there times the state after it
        (plus the skip), so the scan computes only the final state, and the gate, norm and projection one position."""
        cfg = self.cfg
        z, x, dt, A, B, C = self._inputs(u)
        _, state = ssd_chunked(x, dt, A, B, C, chunk_length(cfg, u), outputs=False, broadcast=broadcast_products(u))
        heads_per_group = cfg.n_heads // cfg.n_groups
        c_last = C[:, -1].repeat_interleave(heads_per_group, dim=1)  # [b, h, n]: each head's group's C
        y = torch.einsum("bhpn,bhn->bhp", state, c_last) + x[:, -1] * self.D.unsqueeze(-1)
        y = self.norm(y.reshape(u.shape[0], 1, cfg.d_inner) * F.silu(z[:, -1:]))
        return self.out_proj(y)

    def _inputs(self, u: Tensor) -> tuple[Tensor, ...]:
        """(z, x [b, l, h, p], dt [b, l, h], A [h], B, C [b, l, g, n]) of the block's input projection."""
        cfg = self.cfg
        batch, seqlen, _ = u.shape
        gn = cfg.n_groups * cfg.d_state
        z, xBC, dt = torch.split(self.in_proj(u), [cfg.d_inner, self.conv_dim, cfg.n_heads], dim=-1)
        xBC = F.silu(causal_depthwise_conv(xBC, self.conv1d.weight, self.conv1d.bias))
        x, B, C = torch.split(xBC, [cfg.d_inner, gn, gn], dim=-1)
        x = x.reshape(batch, seqlen, cfg.n_heads, cfg.d_head)
        dt = F.softplus(dt + self.dt_bias)  # [b, l, h]
        A = -torch.exp(self.A_log)  # [h]
        groups = (batch, seqlen, cfg.n_groups, cfg.d_state)
        return z, x, dt, A, B.reshape(groups), C.reshape(groups)


class Mamba2(nn.Module):
    """n_layers x (RMSNorm -> Mamba2Block -> residual), then a final RMSNorm. [B, L, d_model] -> [B, L, d_model]."""

    def __init__(self, cfg: Mamba2Config):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(
            nn.ModuleDict({"norm": nn.RMSNorm(cfg.d_model, eps=1e-5), "mixer": Mamba2Block(cfg)}) for _ in range(cfg.n_layers)
        )
        self.norm_f = nn.RMSNorm(cfg.d_model, eps=1e-5)
        with torch.no_grad():  # GPT-2 style: shrink residual-branch outputs by 1/sqrt(n_layers)
            for layer in self.layers:
                layer["mixer"].out_proj.weight.div_(math.sqrt(max(cfg.n_layers, 1)))

    def forward(self, u: Tensor) -> Tensor:  # u [B, L, d_model] -> [B, L, d_model]
        for layer in self.layers:
            u = u + layer["mixer"](layer["norm"](u))
        return self.norm_f(u)

    def forward_last(self, u: Tensor) -> Tensor:  # u [B, L, d_model] -> [B, 1, d_model]
        """`forward(u)[:, -1:]` (inference): every layer but the last over every position, the last one at the last."""
        if not len(self.layers):
            return self.norm_f(u[:, -1:])
        *first, last = self.layers
        for layer in first:
            u = u + layer["mixer"](layer["norm"](u))
        return self.norm_f(u[:, -1:] + last["mixer"].forward_last(last["norm"](u)))
