"""Direction and cost-aware outcome labels per horizon.

For a row t and horizon h, the future row is t+h snapshots (book), or for bars the last bar whose
close is at or before t's close + h minutes. A bar's `ts` is the start of its minute and its price the
minute's close, so that is the last bar starting at or before ts[t] + h minutes. Labels never look
past the file, nor past t + h:

- direction: 1.0 if the (stitched) reference price is strictly higher at the future row, else 0.0; for bars,
  NaN where it did not move (see below);
- outcome_long  = price[future] - price[t] - cost   (round-trip cost in price units),
  outcome_short = price[t] - price[future] - cost,
  NaN where the horizon has no price (a zero move keeps its outcome: the round trip's cost).

NaN marks the rows whose horizon runs past the end of the file and, for bars, the rows with no bar
after t up to the horizon: no trade happened after t's close, so no price was seen. Calling that move
0 ("not up") would make the label a function of the gap, which a model reads from the gap feature.

For bars, a move of zero is no direction either (NaN): a time horizon after a gap spans few trades, so the price
stays put far more often there (21.5% of 5-minute labels after a gap on the demo set, 11.0% elsewhere), and
counting those as "not up" made P(up) 0.388 after gaps against 0.448 elsewhere: a label a model reads from the
gap feature, and that no position can earn. Given a move, P(up) is 0.494 against 0.504 (docs/validity.md). Book
horizons count snapshots, not time, so their chance of no move does not depend on the clock: they keep 0.0.

`LabelStream` labels a series that arrives in chunks: a row is labelled once the rows up to its longest
horizon have arrived, so only that overlap is held.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NS_PER_MINUTE = 60_000_000_000
SNAPSHOTS, MINUTES = "snapshots", "minutes"


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
    """Row of the last bar starting at or before ts + h minutes; -1 where ts + h is past the last bar, or where
    no bar follows t up to ts + h."""
    target = ts_ns + horizon_minutes * NS_PER_MINUTE
    idx = np.searchsorted(ts_ns, target, side="right").astype(np.int64) - 1
    idx[(target > ts_ns[-1]) | (idx <= np.arange(len(ts_ns)))] = -1
    return idx


def make_labels(
    price_fixed: np.ndarray, scale: float, future_rows: list[np.ndarray], cost: float, no_move_is_unlabelled: bool = False
) -> Labels:
    """Labels of the rows 0..n-1 (n = len(future_rows[j])) from an integer fixed-point price
    (price = price_fixed / scale), so "higher" is exact; with `no_move_is_unlabelled` (bars) a zero move has no
    direction label (its outcome labels stay: a flat move still costs the round trip)."""
    n, h = len(future_rows[0]), len(future_rows)
    direction = np.full((n, h), np.nan, dtype=np.float32)
    long_ = np.full((n, h), np.nan, dtype=np.float32)
    short = np.full((n, h), np.nan, dtype=np.float32)
    for j, fut in enumerate(future_rows):
        ok = fut >= 0
        k = int(np.count_nonzero(ok))
        # the labelled rows are usually a prefix (only the tail runs past the end): slice, don't mask
        rows = slice(0, k) if ok[:k].all() else np.flatnonzero(ok)
        move_fixed = price_fixed[fut[rows]] - price_fixed[rows]
        up = (move_fixed > 0).astype(np.float32)
        direction[rows, j] = np.where(move_fixed == 0, np.nan, up) if no_move_is_unlabelled else up
        move = move_fixed / scale
        long_[rows, j] = move - cost
        short[rows, j] = -move - cost
    return Labels(direction, long_, short)


class LabelStream:
    """Labels of a series pushed chunk by chunk, in order; `finish` labels the rows left at the end of the file."""

    def __init__(self, unit: str, horizons: tuple[int, ...], scale: float, cost: float) -> None:
        if unit not in (SNAPSHOTS, MINUTES):
            raise ValueError(f"horizon unit must be {SNAPSHOTS!r} or {MINUTES!r}, got {unit!r}")
        self.unit, self.horizons, self.scale, self.cost = unit, tuple(horizons), scale, cost
        self._price = np.empty(0, dtype=np.int64)  # rows not labelled yet: they wait for their horizon
        self._ts = np.empty(0, dtype=np.int64)

    def push(self, price_fixed: np.ndarray, ts: np.ndarray) -> Labels:
        """Append rows; return the labels of the rows (from the first unlabelled one) that are now complete."""
        self._price = np.concatenate((self._price, price_fixed))
        self._ts = np.concatenate((self._ts, ts))
        longest = max(self.horizons)
        if self.unit == SNAPSHOTS:
            done = max(len(self._ts) - longest, 0)
        else:  # every bar up to ts + h has arrived once a later bar has
            done = int(np.searchsorted(self._ts, self._ts[-1] - longest * NS_PER_MINUTE, side="left"))
        return self._take(done)

    def finish(self) -> Labels:
        return self._take(len(self._ts))

    def _take(self, done: int) -> Labels:
        if self.unit == SNAPSHOTS:
            future = [future_rows_by_count(len(self._ts), h)[:done] for h in self.horizons]
        else:
            future = [future_rows_by_time(self._ts, h)[:done] if done else np.empty(0, np.int64) for h in self.horizons]
        labels = make_labels(self._price, self.scale, future, self.cost, no_move_is_unlabelled=self.unit == MINUTES)
        self._price, self._ts = self._price[done:], self._ts[done:]
        return labels
