"""The validation gate: the one rule that decides whether a trained attempt is promoted and may be reported.

Supervised and book models pass when the mean validation AUC of the kept checkpoint is above `min_val_auc` (and
the training loss is finite); RL agents when their validation Sharpe (the evaluator's daily-session Sharpe) is
above `min_val_sharpe`. Both bounds are strict: a coin flip (AUC 0.5) or a flat policy (Sharpe 0) never passes
with the defaults. The Dagster checkpoint assets record the result as a blocking asset check and promote only
passing attempts, whose report reads only those; `alpha evaluate` applies the same rule to checkpoints trained
outside Dagster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from alpha_core.trainers import Trainer

GATE_CHECK = "validation_gate"  # the name of the Dagster asset check that records this rule for a checkpoint


class GateThresholds(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    min_val_auc: float = Field(0.5, ge=0.0, le=1.0)
    min_val_sharpe: float = 0.0


@dataclass(frozen=True)
class GateResult:
    passed: bool
    metric: str
    value: float
    threshold: float
    reason: str


def check_gate(trainer: Trainer, value: float, thresholds: GateThresholds, train_loss: float | None = None) -> GateResult:
    """`value` is the trainer's gated metric (`Trainer.gated_value`): the mean validation AUC or the validation Sharpe."""
    threshold = thresholds.min_val_sharpe if trainer.gate_metric == "val_sharpe" else thresholds.min_val_auc
    finite = math.isfinite(value) and (train_loss is None or math.isfinite(train_loss))
    passed = finite and value > threshold
    reason = (
        f"{trainer.gate_label} {value:.4f} {'>' if value > threshold else '<='} {threshold}"
        + ("" if train_loss is None else f", train loss {train_loss:.4f}")
        + ("" if finite else ": not finite")
    )
    return GateResult(passed, trainer.gate_metric, value, threshold, reason)
