"""xLSTM in plain PyTorch (Beck et al. 2024, "xLSTM: Extended Long Short-Term Memory"): mLSTM and sLSTM blocks.

Hooks (alpha_core/models/hooks.py): BarModel (`XLSTMModel`), no optional hook.

In-house on purpose: the official ``xlstm`` / ``mlstm_kernels`` packages (NX-AI) are not a dependency (licence, see
docs/libraries.md). Shapes below: ``B`` batch, ``T`` time, ``NH`` heads, ``DH`` head dim.

mLSTM (matrix memory, fully parallelisable)
-------------------------------------------
Per head, with query/key/value ``q_t, k_t, v_t`` (``k_t`` pre-scaled by ``1/sqrt(DH)``), input gate pre-activation
``i~_t`` (exponential gate) and forget gate ``f_t = sigmoid(f~_t)``, the recurrence with its stabiliser ``m_t``::

    m_t = max(log f_t + m_{t-1}, i~_t)                          (m_0 = 0, C_0 = 0, n_0 = 0)
    i'_t = exp(i~_t - m_t),  f'_t = exp(log f_t + m_{t-1} - m_t)
    C_t = f'_t C_{t-1} + i'_t v_t k_t^T                          [DH, DH] matrix memory
    n_t = f'_t n_{t-1} + i'_t k_t                                 normaliser
    h_t = C_t q_t / max(|n_t . q_t|, exp(-m_t))

The stabilised states are the true ones times ``exp(-m_t)``, so ``h_t = C*_t q_t / max(|n*_t . q_t|, 1)`` with the
unstabilised ``C*_t = sum_{s<=t} exp(F_t - F_s + i~_s) v_s k_s^T`` (``F_t = log f_1 + ... + log f_t``): the output does
not depend on ``m`` at all, it only keeps every ``exp`` in range. That gives the parallel (quadratic) form used in
training, a causal attention with a log-gate matrix::

    log D[t, s] = (log f_{s+1} + ... + log f_t) + i~_s   for s <= t,  -inf above the diagonal
    m_t = max_s log D[t, s]                                       (row-wise stabiliser, detached: h is invariant to it)
    S = (q k^T) o exp(log D - m)                                  [T, T]
    h = S v / max(|rowsum(S)|, exp(-m))

``mlstm_parallel`` and ``mlstm_recurrent`` (a loop of ``mlstm_step``) agree to float64 round-off, outputs and
gradients (tests/test_model_xlstm.py).

sLSTM (scalar memory, exponential gating, head-wise recurrence)
---------------------------------------------------------------
Per unit, with gate pre-activations ``g~_t = W_g x_t + R_g h_{t-1} + b_g`` for ``g in (i, f, z, o)``, where each
``R_g`` is block-diagonal (one ``[DH, DH]`` block per head: memory mixes only inside a head)::

    m_t = max(log f_t + m_{t-1}, i~_t)                           (log f_t = logsigmoid(f~_t); m_0 = -inf)
    i'_t = exp(i~_t - m_t),  f'_t = exp(log f_t + m_{t-1} - m_t)
    c_t = f'_t c_{t-1} + i'_t tanh(z~_t)
    n_t = f'_t n_{t-1} + i'_t
    h_t = sigmoid(o~_t) * c_t / n_t

Again ``c_t / n_t`` is the ratio of the unstabilised sums, so ``m`` only guards the exponentials; ``m_0 = -inf``
makes the first step take ``m_1 = i~_1`` (``n_1 = 1``). The ``R h_{t-1}`` term makes it a true recurrence: on the
CPU a Python loop over time (``slstm_loop``: ``unbind`` of the precomputed ``W x``, one batched matmul per step); on
CUDA (float32) one fused Triton kernel per direction (``slstm_triton``: the loop's 6,000 launches a training step
were 96% of the member's ops), equal to the loop in values and gradients.

Blocks (pre-norm residual, as in the paper / NX-AI's reference layers)
---------------------------------------------------------------------
* mLSTM block (pre up-projection): ``LayerNorm -> up-proj to [x_m, z] (expand * d_model each) -> causal depthwise
  conv + SiLU on x_m -> q, k from the conv output, v from x_m -> gates i~, f~ = Linear([q, k, v]) -> mLSTM ->
  per-head LayerNorm -> + skip * conv output -> * SiLU(z) -> down-proj``, added to the residual.
* sLSTM block (post up-projection): ``LayerNorm -> causal conv + SiLU feeding the i, f gates (z, o see the normed
  input) -> sLSTM -> per-head LayerNorm``, added to the residual; then ``LayerNorm -> gated GELU MLP (4/3 width)``,
  added to the residual.

``XLSTMModel``: ``Linear(n_features, d_model)`` embedding, the blocks in ``cfg.blocks`` order, a final LayerNorm and a
``Linear(d_model, len(horizons))`` head: logits ``[B, K, H]``, causal (position k only sees ``x[:, :k+1]``).
No ``.item()``, no host syncs, no data-dependent control flow; runs on cpu and cuda.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

from alpha_core.bounds import Count, Dim, Dropout

__all__ = [
    "MLSTMState",
    "SLSTMState",
    "XLSTMConfig",
    "XLSTMModel",
    "MLSTMBlock",
    "SLSTMBlock",
    "mlstm_parallel",
    "mlstm_recurrent",
    "mlstm_step",
    "slstm_initial_state",
    "slstm_loop",
    "slstm_step",
]

MLSTMState = tuple[Tensor, Tensor, Tensor]  # C [B, NH, DH, DH], n [B, NH, DH], m [B, NH]
SLSTMState = tuple[Tensor, Tensor, Tensor, Tensor]  # h, c, n, m: each [B, NH, DH]
FUSED_MAX_HEAD = 32  # sLSTM head widths the fused CUDA kernels take (R's four [DH, DH] blocks stay in registers)


# --------------------------------------------------------------------------------------------- mLSTM cell


def _floor(x: Tensor) -> Tensor:
    """Keep a denominator away from exact 0 (only reachable when exp(-m) underflows); never active otherwise."""
    return x.clamp_min(torch.finfo(x.dtype).tiny)


def mlstm_parallel(q: Tensor, k: Tensor, v: Tensor, i_pre: Tensor, f_pre: Tensor) -> Tensor:
    """Parallel (quadratic, causal) mLSTM. q, k, v [B, NH, T, DH]; i_pre, f_pre [B, NH, T] -> h [B, NH, T, DH].

    ``k`` is scaled by ``1/sqrt(DH)`` here. ``log D[t, s] = sum_{s < j <= t} log f_j + i~_s``: the forget-gate
    segment sums are masked, then cumsummed (no difference of two cumsums, which cancels for long sequences).
    """
    T, DH = q.shape[-2], q.shape[-1]
    log_f = F.logsigmoid(f_pre)  # [B, NH, T]
    strictly_lower = torch.ones(T, T, dtype=torch.bool, device=q.device).tril(-1)
    lower = torch.ones(T, T, dtype=torch.bool, device=q.device).tril(0)
    seg = log_f.unsqueeze(-1).expand(*log_f.shape, T).masked_fill(~strictly_lower, 0)  # seg[t, s] = log f_t if t > s
    log_d = (seg.cumsum(dim=-2) + i_pre.unsqueeze(-2)).masked_fill(~lower, -torch.inf)  # [B, NH, T, T]
    m = log_d.amax(dim=-1, keepdim=True).detach()  # row stabiliser; finite (the diagonal is)
    scores = (q @ k.transpose(-1, -2)) * (DH**-0.5) * torch.exp(log_d - m)
    normaliser = torch.maximum(scores.sum(dim=-1, keepdim=True).abs(), torch.exp(-m))
    return (scores @ v) / _floor(normaliser)


def mlstm_step(q: Tensor, k: Tensor, v: Tensor, i_pre: Tensor, f_pre: Tensor, state: MLSTMState) -> tuple[Tensor, MLSTMState]:
    """One recurrent mLSTM step. q, k, v [B, NH, DH]; i_pre, f_pre [B, NH]; state (C, n, m) -> (h [B, NH, DH], state)."""
    C, n, m = state
    k = k * (k.shape[-1] ** -0.5)
    log_f = F.logsigmoid(f_pre)
    m_new = torch.maximum(log_f + m, i_pre)
    i_gate = torch.exp(i_pre - m_new).unsqueeze(-1)
    f_gate = torch.exp(log_f + m - m_new).unsqueeze(-1)
    C = f_gate.unsqueeze(-1) * C + i_gate.unsqueeze(-1) * (v.unsqueeze(-1) * k.unsqueeze(-2))  # C[.., a, b] += v_a k_b
    n = f_gate * n + i_gate * k
    numerator = (C @ q.unsqueeze(-1)).squeeze(-1)
    denominator = torch.maximum((n * q).sum(-1, keepdim=True).abs(), torch.exp(-m_new).unsqueeze(-1))
    return numerator / _floor(denominator), (C, n, m_new)


def mlstm_initial_state(batch: int, n_heads: int, d_head: int, like: Tensor) -> MLSTMState:
    return (
        like.new_zeros(batch, n_heads, d_head, d_head),
        like.new_zeros(batch, n_heads, d_head),
        like.new_zeros(batch, n_heads),
    )


def mlstm_recurrent(
    q: Tensor, k: Tensor, v: Tensor, i_pre: Tensor, f_pre: Tensor, state: MLSTMState | None = None
) -> tuple[Tensor, MLSTMState]:
    """The recurrent form over a sequence (same shapes as ``mlstm_parallel``), returning the final state too."""
    b, nh, _, dh = q.shape
    if state is None:
        state = mlstm_initial_state(b, nh, dh, q)
    hs = []
    for q_t, k_t, v_t, i_t, f_t in zip(q.unbind(2), k.unbind(2), v.unbind(2), i_pre.unbind(2), f_pre.unbind(2), strict=True):
        h_t, state = mlstm_step(q_t, k_t, v_t, i_t, f_t, state)
        hs.append(h_t)
    return torch.stack(hs, dim=2), state


# --------------------------------------------------------------------------------------------- sLSTM cell


def slstm_initial_state(batch: int, n_heads: int, d_head: int, like: Tensor) -> SLSTMState:
    zeros = like.new_zeros(batch, n_heads, d_head)
    return zeros, zeros, zeros, torch.full_like(zeros, -torch.inf)


def slstm_step(wx: Tensor, R: Tensor, state: SLSTMState) -> tuple[Tensor, SLSTMState]:
    """One sLSTM step. wx [B, 4, NH, DH]: ``W x_t + b`` of the gates (i, f, z, o); R [NH, DH, 4, DH] the head-wise
    recurrent weights (``g~[b, g, h, e] += sum_d h_{t-1}[b, h, d] R[h, d, g, e]``); state (h, c, n, m) -> (h, state)."""
    h, c, n, m = state
    raw = wx + torch.einsum("bhd,hdge->bghe", h, R)
    i_pre, f_pre, z_pre, o_pre = raw.unbind(1)
    log_f = F.logsigmoid(f_pre)
    m_new = torch.maximum(log_f + m, i_pre)  # m = -inf at the start: m_new = i_pre
    i_gate = torch.exp(i_pre - m_new)
    f_gate = torch.exp(log_f + m - m_new)  # exp(-inf) = 0 at the start (with c = n = 0)
    c = f_gate * c + i_gate * torch.tanh(z_pre)
    n = f_gate * n + i_gate  # >= i_gate, and i_gate = 1 wherever i_pre sets the max
    h = torch.sigmoid(o_pre) * c / n
    return h, (h, c, n, m_new)


# --------------------------------------------------------------------------------------------- config


class XLSTMConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n_features: Count
    horizons: tuple[int, ...] = (5, 15, 60)
    d_model: Dim = 32  # residual stream width
    n_heads: Dim = 4  # heads of both cells (mLSTM head dim = expand * d_model / n_heads, sLSTM = d_model / n_heads)
    blocks: tuple[Literal["m", "s"], ...] = Field(("m", "s"), max_length=256)  # block pattern, bottom to top
    mlstm_expand: Dim = 2  # mLSTM up-projection factor
    conv_kernel: Dim = 4  # causal depthwise conv width (mLSTM q/k path, sLSTM i/f gates)
    ffn_factor: float = Field(4 / 3, gt=0, le=64)  # sLSTM block's post up-projection (gated MLP) width factor
    dropout: Dropout = 0.0  # on each block's residual branch

    @model_validator(mode="after")
    def _check(self) -> XLSTMConfig:
        if min(self.n_features, self.d_model, self.n_heads, self.mlstm_expand, self.conv_kernel) < 1:
            raise ValueError("all sizes must be >= 1")
        if not self.horizons:
            raise ValueError("need at least one horizon")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model = {self.d_model} not divisible by n_heads = {self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("dropout must be in [0, 1)")
        if self.ffn_factor <= 0:
            raise ValueError("ffn_factor must be > 0")
        return self


# --------------------------------------------------------------------------------------------- blocks


class CausalConv1d(nn.Module):
    """Depthwise causal conv over time: [B, T, D] -> [B, T, D], position t sees t - kernel + 1 .. t."""

    def __init__(self, dim: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, kernel, groups=dim, padding=kernel - 1)

    def forward(self, x: Tensor) -> Tensor:  # x [B, T, D] -> [B, T, D]
        return self.conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)


class HeadNorm(nn.Module):
    """LayerNorm inside each head (the paper's multi-head "group norm"): [B, T, NH, DH] -> [B, T, NH * DH]."""

    def __init__(self, n_heads: int, d_head: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_heads * d_head))
        self.d_head = d_head

    def forward(self, x: Tensor) -> Tensor:  # x [B, T, NH, DH] -> [B, T, NH * DH]
        x = F.layer_norm(x, (self.d_head,), eps=1e-5)
        return x.flatten(-2) * self.weight


class MLSTMBlock(nn.Module):
    """Pre-norm mLSTM block with up-projection: [B, T, d_model] -> [B, T, d_model] (the residual branch only)."""

    def __init__(self, cfg: XLSTMConfig):
        super().__init__()
        d_inner = cfg.mlstm_expand * cfg.d_model
        self.n_heads, self.d_head = cfg.n_heads, d_inner // cfg.n_heads
        if d_inner % cfg.n_heads:
            raise ValueError(f"mlstm_expand * d_model = {d_inner} not divisible by n_heads = {cfg.n_heads}")
        self.norm = nn.LayerNorm(cfg.d_model)
        self.up_proj = nn.Linear(cfg.d_model, 2 * d_inner)  # -> x_m, z
        self.conv = CausalConv1d(d_inner, cfg.conv_kernel)
        self.q_proj = nn.Linear(d_inner, d_inner, bias=False)
        self.k_proj = nn.Linear(d_inner, d_inner, bias=False)
        self.v_proj = nn.Linear(d_inner, d_inner, bias=False)
        self.gates = nn.Linear(3 * d_inner, 2 * cfg.n_heads)  # -> i~, f~ per head
        with torch.no_grad():  # as NX-AI: zero gate weights; i~ bias ~ N(0, 0.1), f~ bias linspace(3, 6) (long memory)
            self.gates.weight.zero_()
            self.gates.bias[: cfg.n_heads].normal_(0.0, 0.1)
            self.gates.bias[cfg.n_heads :] = torch.linspace(3.0, 6.0, cfg.n_heads)
        self.head_norm = HeadNorm(cfg.n_heads, self.d_head)
        self.skip = nn.Parameter(torch.ones(d_inner))
        self.down_proj = nn.Linear(d_inner, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:  # x [B, T, d_model] -> [B, T, d_model]
        b, t, _ = x.shape
        x_m, z = self.up_proj(self.norm(x)).chunk(2, dim=-1)
        x_c = F.silu(self.conv(x_m))
        q, k, v = self.q_proj(x_c), self.k_proj(x_c), self.v_proj(x_m)
        i_pre, f_pre = self.gates(torch.cat([q, k, v], dim=-1)).transpose(1, 2).chunk(2, dim=1)  # [B, NH, T] each

        def heads(u: Tensor) -> Tensor:
            return u.reshape(b, t, self.n_heads, self.d_head).transpose(1, 2)

        h = mlstm_parallel(heads(q), heads(k), heads(v), i_pre, f_pre)  # [B, NH, T, DH]
        h = self.head_norm(h.transpose(1, 2)) + self.skip * x_c
        return self.dropout(self.down_proj(h * F.silu(z)))


class SLSTMLayer(nn.Module):
    """The sLSTM cell over a sequence: i, f gates from ``x_conv``, z, o gates from ``x``; [B, T, D] -> [B, T, NH, DH]."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.w_if = nn.Linear(d_model, 2 * d_model)  # -> i~, f~ input parts (+ biases)
        self.w_zo = nn.Linear(d_model, 2 * d_model)  # -> z~, o~ input parts (+ biases)
        bound = self.d_head**-0.5
        self.R = nn.Parameter(torch.empty(n_heads, self.d_head, 4, self.d_head).uniform_(-bound, bound))
        with torch.no_grad():
            f_bias = torch.linspace(3.0, 6.0, n_heads).repeat_interleave(self.d_head)
            self.w_if.bias[d_model:] = f_bias

    def forward(self, x: Tensor, x_conv: Tensor, state: SLSTMState | None = None) -> tuple[Tensor, SLSTMState]:
        # x, x_conv [B, T, D] -> (h [B, T, NH, DH], the final state)
        b, t, _ = x.shape
        wx = torch.cat([self.w_if(x_conv), self.w_zo(x)], dim=-1).reshape(b, t, 4, self.n_heads, self.d_head)
        if state is None and wx.is_cuda and wx.dtype == self.R.dtype == torch.float32 and self.d_head <= FUSED_MAX_HEAD:
            from alpha_core.models import slstm_triton  # CUDA only: one fused kernel per direction

            if slstm_triton.usable(wx, lambda wx, R: slstm_loop(wx, R)[0]):
                return slstm_triton.slstm_scan(wx, self.R)
        return slstm_loop(wx, self.R, state)


def slstm_loop(wx: Tensor, R: Tensor, state: SLSTMState | None = None) -> tuple[Tensor, SLSTMState]:
    """`slstm_step` over a sequence: wx [B, T, 4, NH, DH] -> (h [B, T, NH, DH], the final state); the CPU path, and
    the reference of the fused CUDA kernels (alpha_core/models/slstm_triton.py)."""
    if state is None:
        state = slstm_initial_state(wx.shape[0], wx.shape[3], wx.shape[4], wx)
    hs = []
    for wx_t in wx.unbind(1):
        h, state = slstm_step(wx_t, R, state)
        hs.append(h)
    return torch.stack(hs, dim=1), state


class SLSTMBlock(nn.Module):
    """Pre-norm sLSTM block with post up-projection: x + sLSTM(LN x), then + gated-MLP(LN .). Returns the new stream."""

    def __init__(self, cfg: XLSTMConfig):
        super().__init__()
        d = cfg.d_model
        self.norm = nn.LayerNorm(d)
        self.conv = CausalConv1d(d, cfg.conv_kernel)
        self.cell = SLSTMLayer(d, cfg.n_heads)
        self.head_norm = HeadNorm(cfg.n_heads, d // cfg.n_heads)
        d_ffn = max(1, math.ceil(cfg.ffn_factor * d))
        self.ffn_norm = nn.LayerNorm(d)
        self.ffn_up = nn.Linear(d, 2 * d_ffn)  # -> value, gate
        self.ffn_down = nn.Linear(d_ffn, d)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:  # x [B, T, d_model] -> [B, T, d_model]
        u = self.norm(x)
        h, _ = self.cell(u, F.silu(self.conv(u)))
        x = x + self.dropout(self.head_norm(h))
        value, gate = self.ffn_up(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.dropout(self.ffn_down(value * F.gelu(gate)))


class XLSTMModel(nn.Module):
    """xLSTM stack for the zoo: x [B, K, F] -> causal logits [B, K, len(horizons)]."""

    def __init__(self, cfg: XLSTMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Linear(cfg.n_features, cfg.d_model)
        self.blocks = nn.ModuleList(MLSTMBlock(cfg) if kind == "m" else SLSTMBlock(cfg) for kind in cfg.blocks)
        self.norm_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, len(cfg.horizons))

    def forward(self, x: Tensor) -> Tensor:  # x [B, K, F] -> logits [B, K, H]
        if x.dim() != 3 or x.shape[-1] != self.cfg.n_features:
            raise ValueError(f"expected x [B, K, {self.cfg.n_features}], got {tuple(x.shape)}")
        u = self.embed(x)
        for block, kind in zip(self.blocks, self.cfg.blocks, strict=True):
            u = u + block(u) if kind == "m" else block(u)
        return self.head(self.norm_f(u))
