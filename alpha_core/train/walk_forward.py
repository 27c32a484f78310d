"""The settings every walk-forward trainer shares: where the data and outputs are, and which folds to train."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from alpha_core.bounds import Count, Device, GapSessions, NonNegInt, Seed
from alpha_core.data.folds import EMBARGO_SESSIONS, N_FOLDS, PURGE_SESSIONS


class WalkForwardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    data_dir: Path
    output_dir: Path
    predecoded_dir: Path | None = None  # default: $ALPHA_STORAGE_ROOT/predecoded, else {output_dir}/.predecoded
    symbol: str | None = None  # the product to extract when a file maps several
    epochs: Count = 50  # the original system's EPOCHS default
    early_stop_patience: NonNegInt = 5  # 0 disables
    cv_fold: NonNegInt | None = None  # None: every fold of the plan
    cv_n_folds: Count = N_FOLDS  # 1: the single train/validation split, without a test file
    cv_train_window: NonNegInt = 0  # calendar quarters; 0: n_quarters - cv_n_folds - 1 (a test quarter after every fold)
    allow_untested_folds: bool = False  # a fold without a test file is an explicit opt-in
    purge_sessions: GapSessions = PURGE_SESSIONS  # sessions dropped from training before validation (folds.py)
    embargo_sessions: GapSessions = EMBARGO_SESSIONS  # sessions not scored at a validation and a test quarter's start
    seed: Seed = 0x4242
    device: Device | None = None  # None: cuda when available


PER_CALL = {"cv_fold", "out", "output_dir", "predecoded_dir", "resume", "device"}  # where and which fold, not how


def fold_unit(settings: dict) -> str:
    """The unit a CLI-trained fold belongs to: a digest of the settings its folds share (not the fold, the output,
    the cache or the device). Folds trained one call at a time with the same settings (how pods train) form one
    unit, as one call for every fold does; a rerun with other settings is another unit, which a report never mixes
    with this one."""
    import hashlib
    import json

    shared = {k: v for k, v in settings.items() if k not in PER_CALL}
    return hashlib.sha256(json.dumps(shared, sort_keys=True, default=str).encode()).hexdigest()[:16]
