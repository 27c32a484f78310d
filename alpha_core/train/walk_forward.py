"""The settings every walk-forward trainer shares: where the data and outputs are, and which folds to train."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict


class WalkForwardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: Path
    output_dir: Path
    predecoded_dir: Path | None = None  # default: $ALPHA_STORAGE_ROOT/predecoded, else {output_dir}/.predecoded
    symbol: str | None = None  # the product to extract when a file maps several
    epochs: int = 50  # the spec's EPOCHS default
    early_stop_patience: int = 5
    cv_fold: int | None = None  # None: every fold of the plan
    cv_n_folds: int = 1
    cv_train_window: int = 0
    seed: int = 0x4242
    device: str | None = None
