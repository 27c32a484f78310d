"""The evaluation's settings, apart from the evaluation: `alpha evaluate --help` builds its options from this class
(each default written once, here) without importing torch. `alpha_core.eval.evaluate.EvalConfig` (and its
DEFAULT_* constants) remain importable."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alpha_core import metrics
from alpha_core.bounds import Device, GapSessions, NonNegFloat, NonNegInt
from alpha_core.data.folds import EMBARGO_SESSIONS
from alpha_core.eval.report import Excluded
from alpha_core.gates import GateThresholds

ENSEMBLES = ("equal_weight", "validation_weighted")
DEFAULT_HORIZON = 0  # the horizon index positions follow (0 = the shortest)
DEFAULT_BAND = 0.05  # flat while |P(up) - 0.5| <= band


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    models_dir: Path
    data_dir: Path
    output: Path  # ensemble_report.json; the Markdown and PNGs go beside it
    symbols: list[str] | None = None
    horizon: NonNegInt = DEFAULT_HORIZON  # index into the sidecar horizons; checked against them in evaluate()
    band: float = Field(DEFAULT_BAND, ge=0, lt=0.5)  # flat while |P(up) - 0.5| <= band
    # how probabilities become positions (alpha_core/eval/policy.py): each checkpoint's policy fitted on its validation
    # file (horizon, threshold, holding, sizing: `horizon` and `band` are unused), or the fixed rule at `horizon`/`band`
    policy: Literal["fitted", "fixed"] = "fitted"
    cost_ticks: NonNegFloat = metrics.DEFAULT_COST_TICKS  # per unit of position change (a 2-tick round trip)
    # the first sessions of every validation and test quarter that are not scored: the fold plan's (folds.py); a
    # checkpoint whose plan recorded another is excluded (its validation was cut otherwise)
    embargo_sessions: GapSessions = EMBARGO_SESSIONS
    predecoded_dir: Path | None = None
    device: Device | None = None
    # model (or "model/SYMBOL") -> the hyperopt results.json behind checkpoints whose summary records none
    hyperopt_results: dict[str, Path] = {}
    # (model, fold) pairs that were requested for every evaluated symbol: one without a checkpoint is listed
    expected: list[tuple[str, NonNegInt]] | None = None

    # checkpoints the caller already knows are unusable (Dagster: never materialized, gate failed), with the reason
    upstream_excluded: list[Excluded] = []
    # the validation gate every checkpoint must pass to be reported (alpha_core.gates: the rule of promotion);
    # None only where each checkpoint already passed its own (Dagster's report reads promoted attempts only)
    gate: GateThresholds | None = GateThresholds()
    run_id: str | None = None  # the pipeline run the report belongs to (Dagster's ensemble_report sets it)
    reused: dict[str, str] = {}  # "model fold k" -> the other run it was reused from by name

    @field_validator("expected", mode="before")
    @classmethod
    def _model_colon_fold(cls, value):
        """The command line gives "model:fold" strings."""
        if not isinstance(value, list):
            return value
        return [tuple(v.rsplit(":", 1)) if isinstance(v, str) and ":" in v else v for v in value]
