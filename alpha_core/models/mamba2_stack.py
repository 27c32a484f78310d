"""Mamba2 ensemble member: input projection -> stacked Mamba2 blocks (the flagship's SSD) -> per-horizon heads.

Hooks (alpha_core/models/hooks.py): BarModel (`Mamba2StackModel`) with LastPosition, CpuBatch.

x [B, K, F] -> Linear(F, d_model) -> Mamba2 x n_layers (pre-norm residual, final RMSNorm) -> Linear(d_model, H).
The SSD recurrence is causal, so the logit at position k depends on x[:, :k+1] only.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from torch import Tensor, nn

from alpha_core.bounds import Count, Dim
from alpha_core.models.mamba2 import Mamba2, Mamba2Config


class Mamba2StackConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n_features: Count
    horizons: tuple[int, ...] = (5, 15, 60)
    d_model: Dim = 64
    d_state: Dim = 16
    d_head: Dim = 16
    n_layers: Dim = 2
    chunk_size: Dim = 16


class Mamba2StackModel(nn.Module):
    cpu_batch = 32  # windows per forward in CPU evaluation: 15% less CPU a window than 128 (bench/README.md)

    def __init__(self, cfg: Mamba2StackConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_proj = nn.Linear(cfg.n_features, cfg.d_model)
        self.backbone = Mamba2(
            Mamba2Config(
                d_model=cfg.d_model, d_state=cfg.d_state, d_head=cfg.d_head, n_layers=cfg.n_layers, chunk_size=cfg.chunk_size
            )
        )
        self.heads = nn.Linear(cfg.d_model, len(cfg.horizons))

    def forward(self, x: Tensor) -> Tensor:  # x [B, K, F] -> logits [B, K, H]
        return self.heads(self.backbone(self.input_proj(x)))

    def last_position(self, x: Tensor) -> Tensor:
        """`forward(x)[:, -1]`, [B, H], for evaluation, which reads only each window's last position."""
        return self.heads(self.backbone.forward_last(self.input_proj(x)))[:, -1]
