"""A sidecar's stored layout: its two kinds, its arrays and their dtypes on disk, and the feature sums its meta
records. Both the sidecar (which reads it) and the build (which writes it) import this, never each other."""

from __future__ import annotations

from typing import Literal

import numpy as np

BOOK, BARS = "book", "bars"
Kind = Literal["book", "bars"]
ARRAYS = ("features", "ts", "price", "dt", "trade_ts", "labels", "outcome_long", "outcome_short", "instrument_id")
WIDE = {
    "features": np.dtype(np.float32),
    "ts": np.dtype(np.int64),
    "price": np.dtype(np.float64),
    "dt": np.dtype(np.float32),
    "trade_ts": np.dtype(np.int64),
    "labels": np.dtype(np.float32),
    "outcome_long": np.dtype(np.float32),
    "outcome_short": np.dtype(np.float32),
    "instrument_id": np.dtype(np.uint32),
}
# each array's dtype on disk, by kind. A real quarter is 220.5M book rows: its features (ticks, shares and logs,
# rounded by at most 2^-11 of their value) and labels (0, 1 or NaN: exact) as float16 take a book row from 296 to
# 176 bytes. Bar sidecars are small, and their features (log returns) want float32's precision.
STORED_DTYPES: dict[str, dict[str, np.dtype]] = {
    BARS: WIDE,
    BOOK: {**WIDE, "features": np.dtype(np.float16), "labels": np.dtype(np.float16)},
}


def column_sums(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum, sum of squares) of each column, in float64: a sidecar's `feature_sums`."""
    wide = np.asarray(values, dtype=np.float64)
    return wide.sum(axis=0), np.einsum("ij,ij->j", wide, wide)
