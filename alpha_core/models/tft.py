"""Temporal Fusion Transformer (Lim, Arik, Loeff & Pfister 2021, "Temporal Fusion Transformers for interpretable
multi-horizon time series forecasting", IJF), in-house, as a causal per-position classifier of the alpha zoo.

Hooks (alpha_core/models/hooks.py): BarModel (`TFTModel`) with PositionWise.

Why in-house: pytorch-forecasting 1.8.0's TFT is a LightningModule fed by a DataFrame-built batch dict, with ~20
graph breaks (``.item()`` on encoder lengths) and ~250 MB of dependencies (docs/libraries.md). The pieces are
small; here they are batch-first and take our tensor windows ``x [B, K, F] -> logits [B, K, H]``.

Building blocks (``a`` input, ``W``/``b`` weights; the dropout sits before the GLU, as in the paper)
---------------------------------------------------------------------------------------------------
    GLU(g)     = (W_5 g + b_5) * sigmoid(W_4 g + b_4)                     (one [2 d_out] linear, ``F.glu``)
    GRN(a)     = LayerNorm(skip(a) + GLU(eta_1))                          skip = identity if d_in == d_out, else linear
       eta_2   = ELU(W_2 a + b_2)
       eta_1   = W_1 eta_2 + b_1
    GateAddNorm(g, r) = LayerNorm(r + GLU(g))                             (a gated skip connection)

Variable selection over the F inputs (position-wise, so causal)
----------------------------------------------------------------
Each scalar feature j gets its own linear embedding ``xi_j = x_j w_j + c_j`` (``[d]``). The selection weights are
``v = softmax(GRN_v([xi_1; ...; xi_F]))`` (``[F]``, sum to 1), each embedding goes through its own
``GRN_j: d -> d``, and the selected input is ``xi~ = sum_j v_j GRN_j(xi_j)``. The F per-feature GRNs are one
grouped GRN (weights stacked on a leading ``[F]`` axis, applied with an einsum, no Python loop over features).

Temporal processing
-------------------
    phi       = LSTM(xi~)                                      (causal by construction)
    phi~      = GateAddNorm(phi, xi~)                          gated skip over the LSTM
    theta     = GRN_e(phi~)                                    "static enrichment" without a static context
    beta      = InterpretableMHA(theta) with a causal mask
    delta     = GateAddNorm(beta, theta)
    psi       = GRN_ff(delta)                                  position-wise feed-forward
    psi~      = GateAddNorm(psi, phi~)                         gated skip over the whole attention block
    logits    = W_out psi~ + b_out                             [B, K, H], one logit per horizon

Interpretable multi-head attention: per-head queries and keys, but ONE value projection shared by all heads, and
the heads averaged before the output projection, so a single ``[K, K]`` pattern explains the output::

    A_h   = softmax(Q_h K_h^T / sqrt(d_head) + M)              M[i, j] = -inf for j > i (causal)
    beta  = W_H ( (1/m) sum_h A_h (theta W_V) )  =  W_H ( mean_h(A_h) V )

Simplifications with respect to the paper (documented on purpose)
-----------------------------------------------------------------
- No static covariates: no static variable selection, no static encoders, so no context vectors c_s, c_e, c_c,
  c_h; the LSTM starts from a zero state and the static-enrichment GRN has no context input.
- No decoder / known-future inputs: there is one sequence (the past window), one LSTM (the "encoder"), and every
  position ``k`` predicts its own horizons from ``x[:, :k+1]``. Attention is causal over the whole window rather
  than "decoder attends to encoder + past decoder".
- Classification heads (one logit per horizon, trained with BCE) instead of quantile regression outputs.
- One embedding size ``d_model`` serves as hidden size of every GRN; the selection GRN maps ``F*d -> d -> F``.

No ``.item()``, no host syncs, no data-dependent control flow; the causal mask is built from static shapes. The
last forward's selection weights ``[B, K, F]`` and per-head attention ``[B, n_heads, K, K]`` are kept (detached) in
``last_variable_weights`` / ``last_attention`` for interpretation reports.
"""

from __future__ import annotations

import math

import pydantic
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from alpha_core.bounds import Count, Dim, Dropout

__all__ = [
    "GRN",
    "GateAddNorm",
    "InterpretableMultiHeadAttention",
    "TFTConfig",
    "TFTModel",
    "VariableSelectionNetwork",
]


def _uniform(*shape: int, fan_in: int) -> nn.Parameter:
    """nn.Linear's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))


class GRN(nn.Module):
    """Gated residual network ``LayerNorm(skip(a) + GLU(W_1 ELU(W_2 a + b_2) + b_1))``.

    Ungrouped (``n_groups=None``): ``a [..., d_in] -> [..., d_out]``, weights ``[d_in, d_out]``-shaped.
    Grouped (``n_groups=G``): G independent GRNs with stacked weights, ``a [..., G, d_in] -> [..., G, d_out]``.
    Weights are stored ``[in, out]`` (transposed from nn.Linear), so ``y = a @ w + b``.
    """

    def __init__(self, d_in: int, d_hidden: int, d_out: int, n_groups: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.d_in, self.d_hidden, self.d_out, self.n_groups = d_in, d_hidden, d_out, n_groups
        g = () if n_groups is None else (n_groups,)
        self.w2, self.b2 = _uniform(*g, d_in, d_hidden, fan_in=d_in), _uniform(*g, d_hidden, fan_in=d_in)
        self.w1, self.b1 = _uniform(*g, d_hidden, d_hidden, fan_in=d_hidden), _uniform(*g, d_hidden, fan_in=d_hidden)
        self.w_glu = _uniform(*g, d_hidden, 2 * d_out, fan_in=d_hidden)  # [value | gate]
        self.b_glu = _uniform(*g, 2 * d_out, fan_in=d_hidden)
        if d_in != d_out:
            self.w_skip, self.b_skip = _uniform(*g, d_in, d_out, fan_in=d_in), _uniform(*g, d_out, fan_in=d_in)
        else:
            self.w_skip = self.b_skip = None
        self.ln_weight = nn.Parameter(torch.ones(*g, d_out))
        self.ln_bias = nn.Parameter(torch.zeros(*g, d_out))
        self.dropout = nn.Dropout(dropout)

    def _lin(self, a: Tensor, w: Tensor, b: Tensor) -> Tensor:
        if self.n_groups is None:
            return a @ w + b
        return torch.einsum("...gi,gio->...go", a, w) + b

    def forward(self, a: Tensor) -> Tensor:  # a [..., d_in] -> [..., d_out] (grouped: [..., G, d_in] -> [..., G, d_out])
        eta2 = F.elu(self._lin(a, self.w2, self.b2))
        eta1 = self._lin(eta2, self.w1, self.b1)
        gated = F.glu(self._lin(self.dropout(eta1), self.w_glu, self.b_glu), dim=-1)  # value * sigmoid(gate)
        skip = a if self.w_skip is None else self._lin(a, self.w_skip, self.b_skip)
        return F.layer_norm(skip + gated, (self.d_out,)) * self.ln_weight + self.ln_bias


class GateAddNorm(nn.Module):
    """``LayerNorm(residual + GLU(dropout(g)))``: the gated skip connection of the TFT. ``[..., d] -> [..., d]``."""

    def __init__(self, d: int, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.glu = nn.Linear(d, 2 * d)
        self.norm = nn.LayerNorm(d)

    def forward(self, g: Tensor, residual: Tensor) -> Tensor:  # g, residual [..., d] -> [..., d]
        return self.norm(residual + F.glu(self.glu(self.dropout(g)), dim=-1))


class VariableSelectionNetwork(nn.Module):
    """x [B, K, F] -> (selected [B, K, d], weights [B, K, F]); weights = softmax over the F features."""

    def __init__(self, n_features: int, d: int, dropout: float = 0.0):
        super().__init__()
        self.n_features, self.d = n_features, d
        self.emb_weight = _uniform(n_features, d, fan_in=1)  # one linear 1 -> d per feature
        self.emb_bias = _uniform(n_features, d, fan_in=1)
        self.selector = GRN(n_features * d, d, n_features, dropout=dropout)
        self.feature_grns = GRN(d, d, d, n_groups=n_features, dropout=dropout)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:  # x [B, K, F] -> (selected [B, K, d], weights [B, K, F])
        xi = x.unsqueeze(-1) * self.emb_weight + self.emb_bias  # [B, K, F, d]
        weights = torch.softmax(self.selector(xi.flatten(-2)), dim=-1)  # [B, K, F]
        processed = self.feature_grns(xi)  # [B, K, F, d]
        return torch.einsum("bkf,bkfd->bkd", weights, processed), weights


class InterpretableMultiHeadAttention(nn.Module):
    """Per-head Q/K, one shared V, heads averaged, causal. theta [B, K, d] -> (out [B, K, d], attn [B, h, K, K])."""

    def __init__(self, d: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        if d % n_heads:
            raise ValueError(f"d_model {d} not divisible by n_heads {n_heads}")
        self.n_heads, self.d_head = n_heads, d // n_heads
        self.q = nn.Linear(d, d)  # n_heads x d_head queries
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, self.d_head)  # shared across heads
        self.out = nn.Linear(self.d_head, d)  # W_H
        self.dropout = nn.Dropout(dropout)

    def forward(self, theta: Tensor) -> tuple[Tensor, Tensor]:  # theta [B, K, d] -> (out [B, K, d], attn [B, h, K, K])
        b, k, _ = theta.shape
        q = self.q(theta).view(b, k, self.n_heads, self.d_head)
        key = self.k(theta).view(b, k, self.n_heads, self.d_head)
        scores = torch.einsum("bihe,bjhe->bhij", q, key) / math.sqrt(self.d_head)
        future = torch.ones(k, k, dtype=torch.bool, device=theta.device).triu(1)  # j > i
        attn = torch.softmax(scores.masked_fill(future, -torch.inf), dim=-1)  # [B, h, K, K]
        mixed = self.dropout(attn).mean(dim=1) @ self.v(theta)  # (1/h) sum_h A_h V: [B, K, d_head]
        return self.out(mixed), attn


class TFTConfig(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    n_features: Count
    horizons: tuple[int, ...] = (5, 15, 60)
    d_model: Dim = 32  # embedding / hidden size everywhere
    n_heads: Dim = 4  # interpretable attention heads (d_model % n_heads == 0)
    lstm_layers: Dim = 1
    dropout: Dropout = 0.0

    @pydantic.model_validator(mode="after")
    def _check(self) -> TFTConfig:
        if min(self.n_features, self.d_model, self.n_heads, self.lstm_layers, len(self.horizons)) < 1:
            raise ValueError("n_features, d_model, n_heads, lstm_layers and horizons must be >= 1")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} not divisible by n_heads {self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("dropout must be in [0, 1)")
        return self


class TFTModel(nn.Module):
    """Causal TFT classifier: x [B, K, F] -> logits [B, K, H]; position k uses only x[:, :k+1]."""

    def __init__(self, cfg: TFTConfig):
        super().__init__()
        self.cfg = cfg
        d, p = cfg.d_model, cfg.dropout
        self.vsn = VariableSelectionNetwork(cfg.n_features, d, p)
        self.lstm = nn.LSTM(d, d, num_layers=cfg.lstm_layers, batch_first=True, dropout=p if cfg.lstm_layers > 1 else 0.0)
        self.post_lstm = GateAddNorm(d, p)
        self.enrichment = GRN(d, d, d, dropout=p)
        self.attention = InterpretableMultiHeadAttention(d, cfg.n_heads, p)
        self.post_attention = GateAddNorm(d, p)
        self.feed_forward = GRN(d, d, d, dropout=p)
        self.pre_output = GateAddNorm(d, p)
        self.head = nn.Linear(d, len(cfg.horizons))
        self.last_variable_weights: Tensor | None = None
        self.last_attention: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:  # x [B, K, F] -> logits [B, K, H]
        if x.dim() != 3 or x.shape[-1] != self.cfg.n_features:
            raise ValueError(f"expected x [B, K, {self.cfg.n_features}], got {tuple(x.shape)}")
        selected, weights = self.vsn(x)
        self.last_variable_weights = weights.detach()
        return self.forward_windows(selected)

    def position_wise(self, x: Tensor) -> Tensor:
        """The variable selection's output [B, K, d]: each position reads only its own features, so evaluation runs
        it once per bar and windows the result (`forward_windows`), rather than once in each of the K windows that
        hold the bar (it is about 80% of forward's CPU time)."""
        return self.vsn(x)[0]

    def forward_windows(self, selected: Tensor) -> Tensor:  # selected [B, K, d] -> logits [B, K, H]
        """forward from the variable selection's output [B, K, d] (`position_wise`): logits [B, K, H]."""
        phi, _ = self.lstm(selected)
        phi = self.post_lstm(phi, selected)
        theta = self.enrichment(phi)
        beta, attn = self.attention(theta)
        delta = self.post_attention(beta, theta)
        psi = self.pre_output(self.feed_forward(delta), phi)
        self.last_attention = attn.detach()
        return self.head(psi)
