"""Direction and cost-aware outcome labels per horizon.

For a row t and horizon h, the future row is t+h snapshots (book) or the last bar at or before
t + h minutes (bars; minutes without trades have no bar). Labels never look past the file:

- direction: 1.0 if the (stitched) reference price is strictly higher at the future row, else 0.0
  (a flat move is "not up", so the only NaNs are rows whose horizon runs past the end of the file);
- outcome_long  = price[future] - price[t] - cost   (round-trip cost in price units),
  outcome_short = price[t] - price[future] - cost,
  NaN-masked exactly like the direction label.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NS_PER_MINUTE = 60_000_000_000


@dataclass(frozen=True)
class Labels:
    direction: np.ndarray  # float32 [N, H]
    outcome_long: np.ndarray  # float32 [N, H]
    outcome_short: np.ndarray  # float32 [N, H]


def future_rows_by_count(n: int, horizon: int) -> np.ndarray:
    """Future row index t+h; -1 where it runs past the end."""
    idx = np.arange(n, dtype=np.int64) + horizon
    idx[idx >= n] = -1
    return idx


def future_rows_by_time(ts_ns: np.ndarray, horizon_minutes: int) -> np.ndarray:
    """Row of the last bar at or before ts + h minutes; -1 where ts + h is past the last bar."""
    target = ts_ns + horizon_minutes * NS_PER_MINUTE
    idx = np.searchsorted(ts_ns, target, side="right").astype(np.int64) - 1
    idx[target > ts_ns[-1]] = -1
    return idx


def make_labels(price_fixed: np.ndarray, scale: float, future_rows: list[np.ndarray], cost: float) -> Labels:
    """Labels from an integer fixed-point price (price = price_fixed / scale), so "higher" is exact."""
    n, h = len(price_fixed), len(future_rows)
    direction = np.full((n, h), np.nan, dtype=np.float32)
    long_ = np.full((n, h), np.nan, dtype=np.float32)
    short = np.full((n, h), np.nan, dtype=np.float32)
    for j, fut in enumerate(future_rows):
        ok = fut >= 0
        k = int(np.count_nonzero(ok))
        # the labelled rows are usually a prefix (only the tail runs past the end): slice, don't mask
        rows = slice(0, k) if ok[:k].all() else np.flatnonzero(ok)
        move_fixed = price_fixed[fut[rows]] - price_fixed[rows]
        direction[rows, j] = (move_fixed > 0).astype(np.float32)
        move = move_fixed / scale
        long_[rows, j] = move - cost
        short[rows, j] = -move - cost
    return Labels(direction, long_, short)
