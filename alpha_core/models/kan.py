"""Kolmogorov-Arnold network (Liu et al. 2024, "KAN: Kolmogorov-Arnold Networks") with B-spline edges, in the
efficient-kan formulation (Blealtan/efficient-kan), plus a small causal sequence model built from it.

Hooks (alpha_core/models/hooks.py): BarModel (`KANModel`) with LastPosition.

Why in-house: pykan is a research tool (undeclared imports, writes checkpoints to ``./model`` by default, 19x slower
with its symbolic bookkeeping on) and efficient-kan is not on PyPI; the layer is ~40 lines. See
docs/libraries.md.

B-spline bases (Cox-de Boor)
----------------------------
Each input feature ``i`` has a uniform knot vector extended by ``k = spline_order`` knots on each side of
``grid_range = [lo, hi]`` split into ``G = grid_size`` intervals, spacing ``h = (hi - lo) / G``::

    t_j = lo + (j - k) h,        j = 0 .. G + 2k          (G + 2k + 1 knots, G + k bases)

    B_{j,0}(x) = 1[t_j <= x < t_{j+1}]
    B_{j,p}(x) = (x - t_j) / (t_{j+p} - t_j) B_{j,p-1}(x) + (t_{j+p+1} - x) / (t_{j+p+1} - t_{j+1}) B_{j+1,p-1}(x)

vectorised over the batch, the features and ``j`` (one tensor op per order ``p``; no Python loop over data). On
``[lo, hi]`` the ``G + k`` bases of order ``k`` are a partition of unity; outside the extended grid they are all 0,
so there only the base branch below acts. ``scipy.interpolate.BSpline`` on the same knots is the test oracle.

KANLinear (one KAN layer, ``in -> out``)
----------------------------------------
Every edge ``i -> o`` carries its own learnable univariate function ``phi_{o,i}``; a node sums its edges::

    y_o = sum_i phi_{o,i}(x_i),      phi_{o,i}(x) = w^base_{o,i} silu(x) + s_{o,i} sum_j c_{o,i,j} B_{j,k}(x)

so ``y = W_base silu(x) + (c * s[..., None]).reshape(out, in (G + k)) @ B(x).reshape(in (G + k))``: two matmuls.
``s`` is efficient-kan's "standalone spline scaler". Init as in efficient-kan: ``W_base`` and ``s`` Kaiming-uniform
(times ``scale_base`` / ``scale_spline``), ``c`` small noise (``scale_noise / G``), so each ``phi`` starts close
to ``w^base silu(x)``. ``regularization_loss`` is efficient-kan's cheap stand-in for the paper's activation L1 +
entropy penalty (it uses the mean |c| per edge instead of the mean |phi(x)| over a batch).

Causal sequence model (KANModel): ``x [B, K, F] -> logits [B, K, H]``
--------------------------------------------------------------------
A KAN acts on one vector, so a causal temporal summary feeds it, per position ``t``:

1. ``R`` learnable exponential moving averages of every feature, as normalised causal weighted means::

       m^r_t[f] = sum_{s <= t} a_{r,f}^{t-s} x_s[f] / sum_{s <= t} a_{r,f}^{t-s},    a_{r,f} = sigmoid(logit_{r,f})

   initialised at half-lives ``ema_half_lives`` (bars). Implemented as one einsum with a ``[R, F, K, K]``
   lower-triangular weight (``K`` is a window of tens to a few hundred bars, so ``O(K^2)`` is cheap and has no
   sequential loop; the weights are a masked ``exp`` of non-positive numbers, so no overflow). The division by the
   row sum makes early positions true means of what they have seen instead of values shrunk towards 0.
2. ``z_t = LayerNorm([x_t, m^1_t - x_t, ..., m^R_t - x_t])`` (``F (1 + R)`` wide): the current bar and how far it
   sits from each average, standardised so the values land on the spline grid ``[lo, hi]``.
3. ``KANLinear(F (1 + R) -> hidden)`` -> ``LayerNorm`` -> ``KANLinear(hidden -> H)``: one logit per horizon.

Steps 2-3 act on each position alone and step 1 only looks back, so position ``t`` depends on ``x[:, :t+1]``
only. No ``.item()``, no host syncs, no data-dependent control flow; static shapes; CPU and CUDA.
"""

from __future__ import annotations

import math

import pydantic
import torch
import torch.nn.functional as F
from pydantic import ConfigDict, Field
from torch import Tensor, nn

from alpha_core.bounds import Count, Dim, FiniteFloat, NonNegFloat, PositiveFloat

__all__ = ["KANConfig", "KANLinear", "KANModel", "b_spline_bases", "extended_grid"]


# --------------------------------------------------------------------------------------------- B-splines


def extended_grid(grid_size: int, spline_order: int, grid_range: tuple[float, float] = (-1.0, 1.0)) -> Tensor:
    """The uniform knot vector ``t_j = lo + (j - k) h``, ``j = 0 .. G + 2k`` (float64, ``[G + 2k + 1]``)."""
    lo, hi = grid_range
    h = (hi - lo) / grid_size
    return torch.arange(-spline_order, grid_size + spline_order + 1, dtype=torch.float64) * h + lo


def b_spline_bases(x: Tensor, grid: Tensor, spline_order: int) -> Tensor:
    """Cox-de Boor: ``x [..., n]``, knots ``grid [n, G + 2k + 1]`` (one row per feature) -> ``[..., n, G + k]``."""
    d = x.unsqueeze(-1) - grid  # x - t_j, [..., n, G + 2k + 1], shared by every order
    bases = ((d[..., :-1] >= 0) & (d[..., 1:] < 0)).to(x.dtype)  # order 0: t_j <= x < t_{j+1}, [..., n, G + 2k]
    for p in range(1, spline_order + 1):
        # (x - t_j) / (t_{j+p} - t_j) and (t_{j+p+1} - x) / (t_{j+p+1} - t_{j+1}); reciprocals are per-knot, tiny
        left = d[..., : -(p + 1)] * (grid[:, p:-1] - grid[:, : -(p + 1)]).reciprocal()
        right = d[..., p + 1 :] * (grid[:, 1:-p] - grid[:, p + 1 :]).reciprocal()
        bases = left * bases[..., :-1] + right * bases[..., 1:]
    return bases


class KANLinear(nn.Module):
    """One KAN layer ``[..., in_features] -> [..., out_features]`` (efficient-kan's ``KANLinear``, no grid update)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        grid_size: int = 5,
        spline_order: int = 3,
        grid_range: tuple[float, float] = (-1.0, 1.0),
        scale_noise: float = 0.1,
        scale_base: float = 1.0,
        scale_spline: float = 1.0,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.grid_size, self.spline_order = grid_size, spline_order
        n_bases = grid_size + spline_order
        grid = extended_grid(grid_size, spline_order, grid_range).to(torch.get_default_dtype())
        self.register_buffer("grid", grid.expand(in_features, -1).contiguous())  # [in, G + 2k + 1], per feature
        self.base_weight = nn.Parameter(torch.empty(out_features, in_features))
        self.spline_weight = nn.Parameter(torch.empty(out_features, in_features, n_bases))
        self.spline_scaler = nn.Parameter(torch.empty(out_features, in_features))
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.base_weight, a=math.sqrt(5) * scale_base)
            nn.init.kaiming_uniform_(self.spline_scaler, a=math.sqrt(5) * scale_spline)
            self.spline_weight.uniform_(-scale_noise / grid_size, scale_noise / grid_size)

    def b_splines(self, x: Tensor) -> Tensor:
        """``[..., in] -> [..., in, G + k]``."""
        return b_spline_bases(x, self.grid, self.spline_order)

    @property
    def scaled_spline_weight(self) -> Tensor:
        return self.spline_weight * self.spline_scaler.unsqueeze(-1)

    def forward(self, x: Tensor) -> Tensor:  # x [..., in] -> [..., out]
        base = F.linear(F.silu(x), self.base_weight)
        spline = F.linear(self.b_splines(x).flatten(-2), self.scaled_spline_weight.flatten(-2))
        return base + spline

    def regularization_loss(self, regularize_activation: float = 1.0, regularize_entropy: float = 1.0) -> Tensor:
        """efficient-kan's approximation: L1 of the mean |spline coefficient| per edge plus the entropy of its share."""
        l1 = self.spline_weight.abs().mean(-1)
        total = l1.sum()
        p = l1 / total
        entropy = -torch.sum(p * torch.log(p))
        return regularize_activation * total + regularize_entropy * entropy


# --------------------------------------------------------------------------------------------- sequence model


class KANConfig(pydantic.BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n_features: Count
    horizons: tuple[int, ...] = (5, 15, 60)  # one logit per horizon
    hidden: Dim = 32  # width of the hidden KAN layer
    grid_size: Dim = 5  # G: spline intervals on grid_range
    spline_order: int = Field(3, ge=0, le=16)  # k: cubic splines
    grid_range: tuple[FiniteFloat, FiniteFloat] = (-2.0, 2.0)  # inputs are LayerNormed, so most mass lands here
    ema_half_lives: tuple[PositiveFloat, ...] = (2.0, 8.0, 32.0)  # initial half-lives (bars) of the learnable EMAs
    scale_noise: NonNegFloat = 0.1
    scale_base: NonNegFloat = 1.0
    scale_spline: NonNegFloat = 1.0

    @pydantic.model_validator(mode="after")
    def _check(self) -> KANConfig:
        if min(self.n_features, self.hidden, self.grid_size, len(self.horizons)) < 1:
            raise ValueError("n_features, hidden, grid_size and len(horizons) must be >= 1")
        if self.spline_order < 0:
            raise ValueError("spline_order must be >= 0")
        if not self.grid_range[0] < self.grid_range[1]:
            raise ValueError(f"grid_range must be increasing, got {self.grid_range}")
        if any(h <= 0 for h in self.ema_half_lives):
            raise ValueError("ema_half_lives must be > 0")
        return self

    @property
    def d_in(self) -> int:
        return self.n_features * (1 + len(self.ema_half_lives))


class CausalEMA(nn.Module):
    """``x [B, K, F] -> [B, K, R, F]``: R learnable causal exponential moving means per feature (see module doc)."""

    def __init__(self, n_features: int, half_lives: tuple[float, ...]) -> None:
        super().__init__()
        decay = torch.tensor([2.0 ** (-1.0 / h) for h in half_lives])  # a = 2^(-1/half_life)
        self.decay_logit = nn.Parameter(torch.logit(decay).unsqueeze(-1).repeat(1, n_features))  # [R, F]

    def weights(self, seqlen: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """Row-normalised causal weights ``[R, F, K, K]`` (``[..., t, s]``, zero for ``s > t``)."""
        idx = torch.arange(seqlen, device=device)
        lag = (idx[:, None] - idx[None, :]).to(dtype)  # t - s
        causal = lag >= 0
        log_a = -F.softplus(-self.decay_logit).to(dtype)  # log sigmoid, < 0
        w = torch.exp(log_a[..., None, None] * lag.clamp(min=0)) * causal  # exponent <= 0
        return w / w.sum(-1, keepdim=True)

    def forward(self, x: Tensor) -> Tensor:  # x [B, K, F] -> [B, K, R, F]
        w = self.weights(x.shape[1], x.dtype, x.device)
        return torch.einsum("rfts,bsf->btrf", w, x)


class KANModel(nn.Module):
    """Causal EMA summary -> LayerNorm -> KANLinear -> LayerNorm -> KANLinear. ``[B, K, F] -> [B, K, H]``."""

    def __init__(self, cfg: KANConfig) -> None:
        super().__init__()
        self.cfg = cfg
        kan = dict(
            grid_size=cfg.grid_size,
            spline_order=cfg.spline_order,
            grid_range=cfg.grid_range,
            scale_noise=cfg.scale_noise,
            scale_base=cfg.scale_base,
            scale_spline=cfg.scale_spline,
        )
        self.ema = CausalEMA(cfg.n_features, cfg.ema_half_lives)
        self.norm_in = nn.LayerNorm(cfg.d_in)
        self.kan1 = KANLinear(cfg.d_in, cfg.hidden, **kan)
        self.norm_hidden = nn.LayerNorm(cfg.hidden)
        self.kan2 = KANLinear(cfg.hidden, len(cfg.horizons), **kan)

    def features(self, x: Tensor) -> Tensor:
        """The per-position KAN input ``[B, K, F (1 + R)]`` before the LayerNorm."""
        dev = self.ema(x) - x.unsqueeze(2)  # [B, K, R, F]
        return torch.cat([x, dev.flatten(-2)], dim=-1)

    def forward(self, x: Tensor) -> Tensor:  # x [B, K, F] -> logits [B, K, H]
        if x.dim() != 3 or x.shape[-1] != self.cfg.n_features:
            raise ValueError(f"x must be [B, K, {self.cfg.n_features}], got {tuple(x.shape)}")
        z = self.norm_in(self.features(x))
        return self.kan2(self.norm_hidden(self.kan1(z)))

    def last_position(self, x: Tensor) -> Tensor:
        """`forward(x)[:, -1]`, [B, H], for evaluation, which reads only each window's last position: the EMAs at
        that position alone, and the KAN layers on it (1 of K positions)."""
        w = self.ema.weights(x.shape[1], x.dtype, x.device)[:, :, -1]  # [R, F, K]: the last position's weights
        last = x[:, -1]
        dev = torch.einsum("rfs,bsf->brf", w, x) - last.unsqueeze(1)  # [B, R, F]
        z = self.norm_in(torch.cat([last, dev.flatten(-2)], dim=-1))
        return self.kan2(self.norm_hidden(self.kan1(z)))

    def regularization_loss(self, regularize_activation: float = 1.0, regularize_entropy: float = 1.0) -> Tensor:
        return sum(layer.regularization_loss(regularize_activation, regularize_entropy) for layer in (self.kan1, self.kan2))
