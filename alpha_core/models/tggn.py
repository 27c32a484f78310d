"""TGGN ensemble member: a temporal gated graph network over the features (nodes) of each bar.

Hooks (alpha_core/models/hooks.py): BarModel (`TGGNModel`) with PositionWise, LastPosition.

"TGGN" is read as GGNN spatial steps + gated temporal convolutions (STGCN / Graph WaveNet
style). For bar data every input feature is a node:

    h0[b, k, n]  = value[b, k, n] * w_val + node_embedding[n]            node state, [B, K, N, d]
    A            = softmax(relu(E1 @ E2.T))                              learned adjacency over the N nodes
    repeat S:      m = A @ (h @ W_s);  h = GRUCell(m, h)                 gated graph step (Li et al. 2016)
    repeat L:      h = h + tanh(conv_f(h)) * sigmoid(conv_g(h))          causal dilated conv per node over time
    logits[b, k] = heads(sum_n softmax_n(a . h[b, k, n]) h[b, k, n])     attention pooling over nodes

Graph steps mix features within one bar only, and the temporal convolutions are left-padded, so the logit
at position k depends on bars 0..k only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from torch import Tensor, nn

from alpha_core.bounds import Count, Dim


class TGGNConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n_features: Count
    horizons: tuple[int, ...] = (5, 15, 60)
    d_node: Dim = 16
    d_embed: Dim = 8  # adjacency embedding size
    graph_steps: Dim = 2
    dilations: tuple[Dim, ...] = (1, 2, 4)
    kernel_size: Dim = 3


class GatedGraphStep(nn.Module):
    """One GGNN step on a dense weighted adjacency: m = A @ (h W), h' = GRUCell(m, h)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.message = nn.Linear(d, d, bias=False)
        self.gru = nn.GRUCell(d, d)

    def forward(self, h: Tensor, adjacency: Tensor) -> Tensor:  # h [B, K, N, d], adjacency [N, N] -> [B, K, N, d]
        m = torch.einsum("nm,...md->...nd", adjacency, self.message(h))
        return self.gru(m.reshape(-1, m.shape[-1]), h.reshape(-1, h.shape[-1])).reshape(h.shape)


class GatedTemporalConv(nn.Module):
    """Residual gated causal convolution over time, shared by all nodes: h + tanh(f) * sigmoid(g)."""

    def __init__(self, d: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.pad = (kernel_size - 1) * dilation
        self.conv = nn.Conv1d(d, 2 * d, kernel_size, dilation=dilation)

    def forward(self, h: Tensor) -> Tensor:  # h [B, K, N, d] -> [B, K, N, d]
        b, k, n, d = h.shape
        seq = h.permute(0, 2, 3, 1).reshape(b * n, d, k)  # each node's series
        f, g = self.conv(F.pad(seq, (self.pad, 0))).chunk(2, dim=1)
        out = (torch.tanh(f) * torch.sigmoid(g)).reshape(b, n, d, k).permute(0, 3, 1, 2)
        return h + out


class TGGNModel(nn.Module):
    def __init__(self, cfg: TGGNConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n, d = cfg.n_features, cfg.d_node
        self.value_weight = nn.Parameter(torch.randn(d) * 0.5)
        self.node_embedding = nn.Parameter(torch.randn(n, d) * 0.1)
        self.e1 = nn.Parameter(torch.randn(n, cfg.d_embed) * 0.5)
        self.e2 = nn.Parameter(torch.randn(n, cfg.d_embed) * 0.5)
        self.graph = nn.ModuleList(GatedGraphStep(d) for _ in range(cfg.graph_steps))
        self.temporal = nn.ModuleList(GatedTemporalConv(d, cfg.kernel_size, dil) for dil in cfg.dilations)
        self.pool = nn.Linear(d, 1)
        self.heads = nn.Linear(d, len(cfg.horizons))

    def adjacency(self) -> Tensor:
        return torch.softmax(torch.relu(self.e1 @ self.e2.T), dim=-1)

    def forward(self, x: Tensor) -> Tensor:  # x [B, K, F] -> logits [B, K, H] (the F features are the N nodes)
        return self.forward_windows(self.position_wise(x))

    def position_wise(self, x: Tensor) -> Tensor:
        """The graph steps' node states [B, K, N, d]: each bar's own features only, so evaluation runs them once per
        bar and windows the result (`forward_windows`, `last_position`), not once in each of the K windows."""
        h = x.unsqueeze(-1) * self.value_weight + self.node_embedding  # [B, K, N, d]
        a = self.adjacency()
        for step in self.graph:
            h = step(h, a)
        return h

    def forward_windows(self, h: Tensor) -> Tensor:  # h [B, K, N, d] -> logits [B, K, H]
        """forward from the graph steps' node states (`position_wise`): logits [B, K, H]."""
        for conv in self.temporal:
            h = conv(h)
        return self._read(h)

    def last_position(self, h: Tensor) -> Tensor:
        """`forward_windows(h)[:, -1]`, [B, H], for evaluation: the convolutions over the last position's receptive
        field only (1 + (kernel - 1) x sum of dilations bars: every state it depends on is inside)."""
        field = 1 + (self.cfg.kernel_size - 1) * sum(self.cfg.dilations)
        h = h[:, -field:]
        for conv in self.temporal:
            h = conv(h)
        return self._read(h[:, -1:])[:, -1]

    def _read(self, h: Tensor) -> Tensor:
        weights = torch.softmax(self.pool(h), dim=2)  # attention pooling over nodes
        return self.heads((weights * h).sum(dim=2))
