"""Feature normalisation statistics, fitted on a fold's training files only (no peeking at val/test)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from alpha_core.atomic import atomic_write_json
from alpha_core.data.sidecar import Sidecar
from alpha_core.errors import DataError, describe_validation_error

MIN_STD = 1e-6


class NormStats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    feature_names: list[str]
    mean: list[float]
    std: list[float]
    rows: int
    sources: list[str]  # sha256 of the training files the stats were fitted on

    def save(self, path: str | Path) -> Path:
        return atomic_write_json(path, self.model_dump())

    @classmethod
    def load(cls, path: str | Path) -> NormStats:
        try:
            return cls.model_validate(json.loads(Path(path).read_text()))
        except (OSError, ValueError, ValidationError) as exc:
            raise DataError(path, f"invalid norm_stats.json: {describe_validation_error(exc)}") from exc

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.mean, dtype=np.float32), np.asarray(self.std, dtype=np.float32)


def fit_norm_stats(train: Sequence[Sidecar]) -> NormStats:
    """Mean and std per feature over every row of the training sidecars (float64), from the sums each sidecar's build
    recorded: O(files), whatever their rows (a real fold's four book quarters were a 10 CPU-minute pass)."""
    if not train:
        raise DataError(None, "cannot fit normalisation statistics on zero training files")
    names = train[0].meta.feature_names
    total = np.zeros(len(names))
    total_sq = np.zeros(len(names))
    rows = 0
    for sc in train:
        if sc.meta.feature_names != names:
            raise DataError(sc.path, "feature_names differ from the first training file")
        file_total, file_total_sq = sc.feature_sums()
        total += file_total
        total_sq += file_total_sq
        rows += sc.rows
    mean = total / rows
    var = np.maximum(total_sq / rows - mean**2, 0.0)
    std = np.sqrt(var)
    std[std < MIN_STD] = 1.0  # a constant feature is centred, not blown up
    return NormStats(
        feature_names=list(names),
        mean=mean.tolist(),
        std=std.tolist(),
        rows=rows,
        sources=[sc.meta.source.sha256 for sc in train],
    )
