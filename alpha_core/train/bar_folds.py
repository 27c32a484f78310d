"""What the two bar trainers (supervised and RL) share: the fold summary's common fields and the loop that trains
folds as attempts and promotes them together. (Apart from `walk_forward.py`, whose settings are read without
importing torch.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from alpha_core import artifacts
from alpha_core.atomic import atomic_write_json
from alpha_core.data.predecode import FoldData
from alpha_core.eval.validation import ValidationScore
from alpha_core.params import HyperoptRecord
from alpha_core.stages import StageClock


class BarFoldSummary(BaseModel):
    """A bar trainer's fold summary (`summary.json`): the fields the supervised and the RL summaries share, so the
    gate, the report and the Dagster metadata read them by one name. The JSON of either is unchanged by the split."""

    model_config = ConfigDict(extra="forbid")

    model: str
    fold: int
    train_files: list[str]  # calendar quarters (`data/folds.py`)
    val_files: list[str]
    test_files: list[str]
    purge_sessions: int = 0  # the fold plan's (folds.py): its train and val rows were cut so
    embargo_sessions: int = 0  # and its test quarter is scored without its first sessions
    epochs: int
    early_stopped: bool
    best_epoch: int
    # the evaluator's Sharpe of the kept checkpoint on the validation file (alpha_core/eval/validation.py): the
    # validation-weighted ensemble's weight, computed once by the step that trained it
    val_score: ValidationScore | None = None
    epoch_metrics: list[dict[str, int | float]] = []  # one row per epoch (the trainer's metrics)
    params: dict
    params_file: str | None = None
    hyperopt: HyperoptRecord | None = None  # the search behind `params`: the report's N and V
    hyperopt_leakage: list[str] = []  # test files the search used, let through by --allow-hyperopt-leakage
    device: str
    wall_time_s: float
    # seconds per stage of the process or fold (alpha_core/stages.py): process_start and imports (the first fold of a
    # process), data, build, epochs, validation, val_score, writing, ...
    stage_s: dict[str, float] = {}
    versions: dict[str, str]
    attempt: str
    unit: str | None = None  # the run whose folds were promoted together (a CLI call); None: one by one (Dagster)

    def write(self, out: Path) -> None:
        atomic_write_json(out / "summary.json", json.loads(self.model_dump_json()))


def versions() -> dict[str, str]:
    """The versions a fold summary records: alpha's, torch's and numpy's."""
    import numpy as np
    import torch

    import alpha_core

    return {"alpha": alpha_core.__version__, "torch": torch.__version__, "numpy": np.__version__}


S = TypeVar("S", bound=BarFoldSummary)


def train_folds(
    output_dir: Path,
    folds: list[FoldData],
    attempt_id: str,
    promote: bool,
    retry: bool,
    summary_class: type[S],
    train_fold: Callable[[FoldData, Path, StageClock], S],
    clock: StageClock,
) -> list[S]:
    """Train each fold as attempt `attempt_id` of `fold-<k>` (`train_fold(fold, folder, clock)`; an attempt already
    complete is read back, not retrained) and, with `promote`, promote them all together once every one is
    complete. The first fold's stages go on `clock` (the process's so far), the others' on their own."""
    units = [artifacts.Attempt(output_dir / f"fold-{fold.fold}", attempt_id) for fold in folds]
    summaries = [
        artifacts.run_attempt(
            attempt,
            lambda out, fold=fold: train_fold(fold, out, clock if fold is folds[0] else StageClock()),
            lambda out: summary_class.model_validate_json((out / "summary.json").read_text()),
            retry,
        )
        for attempt, fold in zip(units, folds, strict=True)
    ]
    if promote:
        artifacts.promote_all(units)
    return summaries
