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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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


def check_gate(trainer: str, value: float, thresholds: GateThresholds, train_loss: float | None = None) -> GateResult:
    """`value` is the mean validation AUC (supervised, perception) or the validation Sharpe (rl)."""
    if trainer == "rl":
        metric, threshold = "val_sharpe", thresholds.min_val_sharpe
        label = "validation Sharpe"
    else:
        metric, threshold = "mean_val_auc", thresholds.min_val_auc
        label = "mean validation AUC"
    finite = math.isfinite(value) and (train_loss is None or math.isfinite(train_loss))
    passed = finite and value > threshold
    reason = (
        f"{label} {value:.4f} {'>' if value > threshold else '<='} {threshold}"
        + ("" if train_loss is None else f", train loss {train_loss:.4f}")
        + ("" if finite else ": not finite")
    )
    return GateResult(passed, metric, value, threshold, reason)


def gated_value(trainer: str, summary: Mapping[str, Any]) -> tuple[float, float | None]:
    """(the gated metric, the final training loss) of a training summary (its JSON): an RL agent's validation
    Sharpe; a supervised or book model's mean validation AUC at the epoch of the checkpoint it kept, which is
    the checkpoint `alpha evaluate` loads. Promotion (Dagster) and `alpha evaluate` read the same numbers."""
    if trainer == "rl":
        return float(summary["val_sharpe"]), None
    aucs = summary["val_auc"]
    return (sum(aucs) / len(aucs) if aucs else math.nan), float(summary["final_train_loss"])
