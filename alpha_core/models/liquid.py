"""Liquid ensemble member: ncps's liquid time-constant network (Hasani et al. 2021) over regular bars.

Hooks (alpha_core/models/hooks.py): BarModel (`LiquidModel`), no optional hook.

x [B, K, F] -> ncps `LTC` (the original authors' library; fully connected wiring, `ode_unfolds` fused Euler
steps per bar, softplus-constrained parameters) -> Linear(units, H). Bars are regular (one per traded
minute), so no timespans are passed: ncps's batched timespans are broken (docs/libraries.md), and the
flagship's irregular-time CfC is in-house for that reason. The recurrence is causal.

On CUDA the recurrence runs as the fused Triton kernels of `ltc_triton.py` (one launch per direction for all bars
and unfolds), with ncps's parameters and math: ncps steps the ODE `ode_unfolds` times per bar in about a dozen
small ops each, so an eager batch was some 10,000 launches (about 6% GPU use on an H200) and compiling the solver
cost 49 s per fold. CPU runs are ncps's own code. Inference batches are cut so that the sensory synapses' [B, L,
F, U] activations stay under `SENSORY_ELEMENTS`.
"""

from __future__ import annotations

import torch
from ncps.torch import LTC
from pydantic import BaseModel, ConfigDict
from torch import Tensor, nn

from alpha_core.bounds import Count, Dim

SENSORY_ELEMENTS = 2**27  # per inference chunk on CUDA: 512 MiB of fp32 activations


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
        self.ltc = LTC(
            cfg.n_features,
            cfg.units,
            return_sequences=True,
            batch_first=True,
            ode_unfolds=cfg.ode_unfolds,
            implicit_param_constraints=True,
        )
        self.heads = nn.Linear(cfg.units, len(cfg.horizons))

    def forward(self, x: Tensor) -> Tensor:  # x [B, K, F] -> logits [B, K, H]
        if not x.is_cuda:
            states, _ = self.ltc(x)
            return self.heads(states)
        cell = self.ltc.rnn_cell
        rows = max(1, SENSORY_ELEMENTS // max(1, x.shape[1] * x.shape[2] * cell.state_size))
        if torch.is_grad_enabled() or x.shape[0] <= rows:
            return self._fused(x)
        return torch.cat([self._fused(part) for part in x.split(rows)])

    def _fused(self, x: Tensor) -> Tensor:
        from alpha_core.models.ltc_triton import ltc_states
        from alpha_core.ncps_private import ltc_params

        cell = self.ltc.rnn_cell
        states = ltc_states(cell, x)[..., : cell.motor_size]  # ncps's output mapping, per bar
        params = ltc_params(cell)
        return self.heads(states * params["output_w"] + params["output_b"])
