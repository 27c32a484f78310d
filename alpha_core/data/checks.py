"""Integrity checks of built sidecars: what the Dagster gates and `alpha predecode` verify."""

from __future__ import annotations

import numpy as np

from alpha_core.data.labels import NS_PER_MINUTE
from alpha_core.data.sidecar import BOOK, Sidecar

BLOCK_ROWS = 1 << 18


def expected_label_tail(sc: Sidecar) -> np.ndarray:
    """bool [N, H]: the only rows allowed NaN: the horizon runs past the end of the file or, for bars, no bar
    follows the row up to its horizon (no trade after its close: no price to label with)."""
    n = sc.rows
    tail = np.zeros((n, len(sc.meta.horizons)), dtype=bool)
    for j, h in enumerate(sc.meta.horizons):
        if sc.meta.kind == BOOK:
            tail[max(n - h, 0) :, j] = True
        else:
            ts = np.asarray(sc.ts)
            target = ts + h * NS_PER_MINUTE
            tail[:, j] = (target > sc.meta.last_ts) | (np.r_[ts[1:], np.iinfo(np.int64).max] > target)
    return tail


def sidecar_problems(sc: Sidecar) -> list[str]:
    """Monotonic time, an uncrossed book, finite features, labels NaN only where a horizon leaves the file."""
    problems = []
    name = sc.meta.source.name
    ts = np.asarray(sc.ts)
    if len(ts) and (np.diff(ts) < 0).any():
        problems.append(f"{name}: timestamps go backwards at row {int(np.argmax(np.diff(ts) < 0)) + 1}")
    col = sc.meta.feature_names.index("spread_ticks" if sc.meta.kind == BOOK else "log_range")
    spread = np.asarray(sc.features[:, col])
    bad_book = spread <= 0 if sc.meta.kind == BOOK else spread < 0
    if bad_book.any():
        problems.append(f"{name}: {int(bad_book.sum())} rows with a crossed/locked book or low > high")
    for start in range(0, sc.rows, BLOCK_ROWS):
        block = np.asarray(sc.features[start : start + BLOCK_ROWS])
        if not np.isfinite(block).all():
            problems.append(f"{name}: non-finite feature values from row {start}")
            break
    return problems + label_tail_problems(sc)


def label_tail_problems(sc: Sidecar) -> list[str]:
    """Labels must be NaN exactly where the horizon runs past the file's end: none crosses a boundary."""
    problems = []
    tail = expected_label_tail(sc)
    for arr_name in ("labels", "outcome_long", "outcome_short"):
        nan = np.isnan(np.asarray(getattr(sc, arr_name)))
        if (nan != tail).any():
            row, h = np.argwhere(nan != tail)[0]
            problems.append(
                f"{sc.meta.source.name}: {arr_name} NaN pattern wrong at row {int(row)}, horizon {sc.meta.horizons[h]}"
            )
    return problems
