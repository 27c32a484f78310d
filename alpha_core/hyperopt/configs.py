"""The search's settings, apart from the search: `alpha hyperopt --help` builds its options from this class (each
default written once, here) without importing torch or nevergrad. `alpha_core.hyperopt.pso.HyperoptConfig` remains
importable."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from alpha_core.bounds import Count, Device, GapSessions, NonNegInt, Seed
from alpha_core.train.walk_forward import WalkForwardConfig


class HyperoptConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str
    data_dir: Path
    output: Path
    trials: Count = 20  # the original system's HYPEROPT_TRIALS
    epochs: Count = 3
    timesteps_per_epoch: Count = 5_000  # RL trials
    workers: int = Field(1, ge=1, le=256)  # threads, one particle each
    seed: Seed = 0
    # the fold plan the search must stay out of the tests of: the same settings (and defaults) as training
    cv_n_folds: Count = WalkForwardConfig.model_fields["cv_n_folds"].default
    cv_train_window: NonNegInt = WalkForwardConfig.model_fields["cv_train_window"].default
    allow_untested_folds: bool = False
    purge_sessions: GapSessions = WalkForwardConfig.model_fields["purge_sessions"].default
    embargo_sessions: GapSessions = WalkForwardConfig.model_fields["embargo_sessions"].default
    cv_fold: NonNegInt | None = None  # nested search: fold k's own train/validation files, for fold k only
    seq_len: Count = 64
    batch_size: Count = 256
    n_train_seqs: Count = 20_000
    n_val_seqs: Count = 5_000
    predecoded_dir: Path | None = None
    symbol: str | None = None
    device: Device | None = None
