"""Liquid ensemble member: ncps's liquid time-constant network (Hasani et al. 2021) over regular bars.

x [B, K, F] -> ncps `LTC` (the original authors' library; fully connected wiring, `ode_unfolds` fused Euler
steps per bar, softplus-constrained parameters) -> Linear(units, H). Bars are regular (one per traded
minute), so no timespans are passed: ncps's batched timespans are broken (see notes/models.md), and the
flagship's irregular-time CfC is in-house for that reason. The recurrence is causal.

On CUDA the cell's ODE solver is torch.compile'd on first use: ncps steps it `ode_unfolds` times per bar in
about a dozen small ops each, so an eager batch is some 10,000 launches (about 6% GPU use on an H200, the
ensemble's longest GPU job in bench/bench_ensemble.py); compiled, each unfold is a few fused kernels. The
parameters and the math are ncps's either way; CPU runs stay eager.
"""

from __future__ import annotations

import torch
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
        if x.is_cuda:
            self._compile_solver()
        states, _ = self.ltc(x)
        return self.heads(states)

    def _compile_solver(self) -> None:
        """Compile this model's ODE solver once (an instance attribute: the state dict does not change)."""
        cell = self.ltc.rnn_cell
        if "_ode_solver" not in vars(cell):
            cell._ode_solver = torch.compile(cell._ode_solver)
