"""Liquid ensemble member: ncps's liquid time-constant network (Hasani et al. 2021) over regular bars.

x [B, K, F] -> ncps `LTC` (the original authors' library; fully connected wiring, `ode_unfolds` fused Euler
steps per bar, softplus-constrained parameters) -> Linear(units, H). Bars are regular (one per traded
minute), so no timespans are passed: ncps's batched timespans are broken (see notes/models.md), and the
flagship's irregular-time CfC is in-house for that reason. The recurrence is causal.
"""

from __future__ import annotations

from ncps.torch import LTC
from pydantic import BaseModel, ConfigDict
from torch import Tensor, nn

from alpha_core.bounds import Count, Dim


class LiquidConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n_features: Count
    horizons: tuple[int, ...] = (5, 15, 60)
    units: Dim = 32
    ode_unfolds: Dim = 6


class LiquidModel(nn.Module):
    def __init__(self, cfg: LiquidConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.ltc = LTC(cfg.n_features, cfg.units, return_sequences=True, batch_first=True,
                       ode_unfolds=cfg.ode_unfolds, implicit_param_constraints=True)
        self.heads = nn.Linear(cfg.units, len(cfg.horizons))

    def forward(self, x: Tensor) -> Tensor:
        states, _ = self.ltc(x)
        return self.heads(states)
