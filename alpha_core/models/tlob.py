"""TLOB (Berti & Kasneci 2025): dual attention over time and over features, made causal for per-position labels.

Hooks (alpha_core/models/hooks.py): BarModel (`TLOBModel`) with LastPosition, CpuBatch.

The paper's model (written here from the paper, no copied code)
---------------------------------------------------------------------------------------------------------
Input ``X [T, F]`` (a window of order-book snapshots) goes through

1. **BiN** (bilinear normalisation): a z-score over the time axis (per feature, statistics of the whole window) and a
   z-score over the feature axis (per time step), each with a learnable scale and bias, mixed as
   ``y1 * feature_norm + y2 * time_norm`` with learnable scalars ``y1, y2``;
2. ``Linear(F -> d)`` plus a sinusoidal positional embedding;
3. ``n_layers`` pairs of transformer layers: the first attends over **time** (``T`` tokens of width ``d``), the second
   over **features** (the tensor is transposed: ``d`` tokens of width ``T``). Each layer is
   ``x = LN(x + W0 MHA(q(x), k(x), v(x)))`` then ``x = LN(x + fc2(GELU(fc1(x))))`` (post-norm, MLP ratio 4);
4. a flatten + MLP head giving 3-class logits for one horizon.

Three parts of that look at the whole window and would leak the future here, where a label sits at every position
``k`` and may only depend on ``x[:, :k+1]``. This module adapts them:

* **Time normalisation -> causal running statistics.** Per feature, mean and variance over positions ``0..k``
  (an expanding window, computed with cumulative sums after subtracting ``x_0`` for numerical conditioning)::

      mu_k = (1/(k+1)) sum_{s<=k} x_s,   var_k = (1/(k+1)) sum_{s<=k} x_s^2 - mu_k^2,
      t_k = gamma_t * (x_k - mu_k) / sqrt(var_k + eps) + beta_t

  At ``k = 0`` the deviation is exactly 0, so ``t_0 = beta_t``.
* **Feature normalisation** is per position already (mean/std over the ``F`` features of ``x_k``), so it is causal
  as is: ``f_k = gamma_f * (x_k - mean_F(x_k)) / sqrt(var_F(x_k) + eps) + beta_f``. BiN's scale/bias for this branch
  is one per *time step* in the paper, which ties the module to one window length; here both branches have one
  scale/bias per *feature* (so any ``K`` works). Mix: ``z_k = softplus(a1) * f_k + softplus(a2) * t_k`` (softplus
  keeps the weights positive without the reference repo's mid-training parameter swap), initialised to 0.5 each.
* **Temporal attention is causally masked**: position ``k`` attends to ``s <= k``.
* **Feature ("spatial") attention is done per position.** The paper's feature tokens are the ``d`` hidden channels,
  each described by its *whole* time series (width ``T``) -- not causal. Here, at each position ``k``, hidden
  channel ``c`` becomes a token ``u_{k,c} = h_{k,c} * w_c + b_c`` in ``R^{d_token}`` (a per-channel lift; ``b_c``
  doubles as the channel's identity embedding, since attention is permutation-equivariant over tokens). The ``d``
  tokens of position ``k`` attend to each other (no mask, no time mixing), go through the same post-norm
  attention + MLP layer, and are read back per channel, ``r_{k,c} = <u'_{k,c}, v_c> + e_c``, as a residual update
  ``h_k <- h_k + r_k``. Since a channel's value at ``k`` already carries its (causal) history from the temporal
  attention before it, the pair still mixes time and features alternately.
* **Heads are per position**: instead of flattening the window, ``len(horizons)`` small MLPs map ``h_k`` to one
  logit each (a shared trunk with per-horizon heads, binary up/down; the paper trains one 3-class model per
  horizon). The paper's shrinking of the last pair to ``d/4`` and ``T/4`` only served the flatten and is dropped,
  as is the GELU it applies after the final LayerNorm of each layer.

Attention of one layer (``h`` heads, each of width ``w``, ``W_q, W_k, W_v: w -> h*w`` as in the paper)::

    q, k, v = x W_q + b_q, x W_k + b_k, x W_v + b_v             split into heads [.., h, n, w]
    A = softmax(q k^T / sqrt(w) + M)                            M = 0 or -inf above the diagonal (temporal)
    x = LN1(x + (A v) W_0 + b_0),  x = LN2(x + W_2 GELU(W_1 x + b_1) + b_2)

Everything is batched tensor algebra with static shapes (no Python loop over time, no host syncs), so it runs on
CPU and CUDA and compiles without graph breaks.
"""

from __future__ import annotations

import math

import pydantic
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from alpha_core.bounds import Count, Dim, Dropout, Layers, PositiveFloat


class TLOBConfig(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    n_features: Count
    horizons: tuple[int, ...] = (5, 15, 60)
    d_model: Dim = 32  # hidden width d of the temporal stream (tokens of the feature attention)
    n_layers: Layers = 2  # number of (temporal, feature) attention pairs
    n_heads: Dim = 1  # heads per attention layer; each head has the layer's full width (paper style)
    d_token: Dim = 8  # width of one hidden-channel token in the per-position feature attention
    mlp_ratio: Dim = 4  # transformer MLP width = mlp_ratio * layer width
    d_head_hidden: Dim = 32  # hidden width of each per-horizon head MLP
    dropout: Dropout = 0.0  # attention-probability and residual dropout (training only)
    bin_eps: PositiveFloat = 1e-5  # variance floor of both BiN branches

    @pydantic.model_validator(mode="after")
    def _check(self) -> TLOBConfig:
        if min(self.n_features, self.d_model, self.n_heads, self.d_token, self.mlp_ratio, self.d_head_hidden) < 1:
            raise ValueError("all sizes must be >= 1")
        if self.n_layers < 0:
            raise ValueError("n_layers must be >= 0")
        if not self.horizons:
            raise ValueError("at least one horizon is needed")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("dropout must be in [0, 1)")
        if self.bin_eps <= 0:
            raise ValueError("bin_eps must be > 0")
        return self


# --------------------------------------------------------------------------------------------- pieces


def _inv_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class CausalBiN(nn.Module):
    """Bilinear normalisation with causal time statistics. [B, K, F] -> [B, K, F]; position k uses x[:, :k+1]."""

    def __init__(self, n_features: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gamma_t = nn.Parameter(torch.ones(n_features))
        self.beta_t = nn.Parameter(torch.zeros(n_features))
        self.gamma_f = nn.Parameter(torch.ones(n_features))
        self.beta_f = nn.Parameter(torch.zeros(n_features))
        self.mix_raw = nn.Parameter(torch.full((2,), _inv_softplus(0.5)))  # softplus -> (y1, y2) = (0.5, 0.5)

    def time_norm(self, x: Tensor) -> Tensor:
        xc = x - x[:, :1]  # shift by the first position: variance unchanged, cumsums better conditioned
        n = torch.arange(1, x.size(1) + 1, device=x.device, dtype=x.dtype).view(1, -1, 1)
        mean = xc.cumsum(dim=1) / n
        var = (xc.square().cumsum(dim=1) / n - mean.square()).clamp_min(0)
        return (xc - mean) * torch.rsqrt(var + self.eps) * self.gamma_t + self.beta_t

    def feature_norm(self, x: Tensor) -> Tensor:
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.gamma_f + self.beta_f

    def forward(self, x: Tensor) -> Tensor:  # x [B, K, F] -> [B, K, F]
        y1, y2 = F.softplus(self.mix_raw).unbind(0)
        return y1 * self.feature_norm(x) + y2 * self.time_norm(x)


def sinusoidal_positions(n: int, d: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """Transformer positional encoding [n, d]: sin on even channels, cos on odd ones (computed in >= fp32)."""
    work = torch.promote_types(dtype, torch.float32)
    pos = torch.arange(n, device=device, dtype=work).unsqueeze(1)
    freq = torch.exp(torch.arange(0, d, 2, device=device, dtype=work) * (-math.log(10000.0) / d))
    pe = torch.zeros(n, d, device=device, dtype=work)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)[:, : d // 2]
    return pe.to(dtype)


class TransformerLayer(nn.Module):
    """Post-norm attention + MLP layer over the second-to-last axis (tokens) of [..., n, width].

    Paper layout: q, k, v are Linear(width -> n_heads * width), so every head has the full width; W0 maps the
    concatenated heads back. ``causal=True`` masks token j > i (the temporal layers).
    """

    def __init__(self, width: int, n_heads: int, mlp_ratio: int, causal: bool, dropout: float = 0.0):
        super().__init__()
        self.width, self.n_heads, self.causal, self.dropout = width, n_heads, causal, dropout
        self.q = nn.Linear(width, n_heads * width)
        self.k = nn.Linear(width, n_heads * width)
        self.v = nn.Linear(width, n_heads * width)
        self.w0 = nn.Linear(n_heads * width, width)
        self.norm1 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, mlp_ratio * width)
        self.fc2 = nn.Linear(mlp_ratio * width, width)
        self.norm2 = nn.LayerNorm(width)

    def attention(self, x: Tensor) -> Tensor:
        *lead, n, w = x.shape
        h = self.n_heads

        def heads(t: Tensor) -> Tensor:  # [..., n, h*w] -> [batch, h, n, w]
            return t.reshape(-1, n, h, w).transpose(1, 2)

        # 4-D: SDPA's fused kernels take [batch, heads, n, w] only; the feature attention's [B, K, h, n, w] fell back
        # to the unfused math path (its masked softmax was half of the model's CPU time)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), dropout_p=p, is_causal=self.causal
        )
        return self.w0(y.transpose(1, 2).reshape(*lead, n, h * w))

    def forward(self, x: Tensor) -> Tensor:  # x [..., n, width] -> [..., n, width]
        p = self.dropout if self.training else 0.0
        x = self.norm1(x + F.dropout(self.attention(x), p, self.training))
        return self.norm2(x + F.dropout(self.fc2(F.gelu(self.fc1(x))), p, self.training))

    def forward_last(self, x: Tensor) -> Tensor:  # x [..., n, width] -> [..., 1, width]
        """`forward(x)[..., -1:, :]` (inference): only the last token queries, every token is a key (causal or not,
        the last token sees them all)."""
        *lead, n, w = x.shape
        h = self.n_heads
        q = self.q(x[..., -1:, :]).reshape(-1, 1, h, w).transpose(1, 2)
        k, v = (proj(x).reshape(-1, n, h, w).transpose(1, 2) for proj in (self.k, self.v))
        y = self.w0(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(*lead, 1, h * w))
        last = self.norm1(x[..., -1:, :] + y)
        return self.norm2(last + self.fc2(F.gelu(self.fc1(last))))


class FeatureAttention(nn.Module):
    """Per-position attention among the d hidden channels. [B, K, d] -> [B, K, d] (residual); no mixing over K."""

    def __init__(self, d_model: int, d_token: int, n_heads: int, mlp_ratio: int, dropout: float = 0.0):
        super().__init__()
        self.lift_w = nn.Parameter(torch.randn(d_model, d_token) / math.sqrt(d_token))
        self.lift_b = nn.Parameter(torch.randn(d_model, d_token) * 0.02)  # channel identity embedding
        self.layer = TransformerLayer(d_token, n_heads, mlp_ratio, causal=False, dropout=dropout)
        self.read_w = nn.Parameter(torch.randn(d_model, d_token) / math.sqrt(d_token))
        self.read_b = nn.Parameter(torch.zeros(d_model))

    def forward(self, h: Tensor) -> Tensor:  # h [B, K, d] -> [B, K, d]
        u = h.unsqueeze(-1) * self.lift_w + self.lift_b  # [B, K, d tokens, d_token]
        u = self.layer(u)
        return h + (u * self.read_w).sum(-1) + self.read_b


class TLOBModel(nn.Module):
    """x [B, K, F] -> per-horizon logits [B, K, H]. Causal: position k uses only x[:, :k+1]."""

    cpu_batch = 32  # windows per forward in CPU evaluation: 20% less CPU a window than 128 (bench/README.md)

    def __init__(self, cfg: TLOBConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.bin = CausalBiN(cfg.n_features, cfg.bin_eps)
        self.embed = nn.Linear(cfg.n_features, d)
        self.temporal = nn.ModuleList(
            TransformerLayer(d, cfg.n_heads, cfg.mlp_ratio, causal=True, dropout=cfg.dropout) for _ in range(cfg.n_layers)
        )
        self.feature = nn.ModuleList(
            FeatureAttention(d, cfg.d_token, cfg.n_heads, cfg.mlp_ratio, cfg.dropout) for _ in range(cfg.n_layers)
        )
        self.heads = nn.ModuleList(
            nn.Sequential(nn.Linear(d, cfg.d_head_hidden), nn.GELU(), nn.Linear(cfg.d_head_hidden, 1)) for _ in cfg.horizons
        )

    def forward(self, x: Tensor) -> Tensor:  # x [B, K, F] -> logits [B, K, H]
        h = self._embedded(x)
        for temporal, feature in zip(self.temporal, self.feature, strict=True):
            h = feature(temporal(h))
        return torch.cat([head(h) for head in self.heads], dim=-1)

    def last_position(self, x: Tensor) -> Tensor:
        """`forward(x)[:, -1]`, [B, H], for evaluation, which reads only each window's last position: the last
        pair attends from that position alone (its feature attention and MLPs run on 1 of K positions)."""
        h = self._embedded(x)
        pairs = list(zip(self.temporal, self.feature, strict=True))
        for temporal, feature in pairs[:-1]:
            h = feature(temporal(h))
        h = h[:, -1:] if not pairs else pairs[-1][1](pairs[-1][0].forward_last(h))
        return torch.cat([head(h[:, -1]) for head in self.heads], dim=-1)

    def _embedded(self, x: Tensor) -> Tensor:
        h = self.embed(self.bin(x))
        return h + sinusoidal_positions(h.size(1), h.size(2), h.device, h.dtype)
