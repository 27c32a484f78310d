"""Integrity checks of built sidecars: what the Dagster gates and `alpha predecode` verify."""

from __future__ import annotations

import datetime as dt

import numpy as np

from alpha_core.data.front_month import NS_PER_DAY, session_days
from alpha_core.data.labels import NS_PER_MINUTE
from alpha_core.data.sidecar import BOOK, Sidecar

BLOCK_ROWS = 1 << 18
# legal but suspicious data (a failed check, not an error): thresholds far outside what CME data shows
MAX_SPREAD_TICKS = 1000  # best ask - best bid of a front-month snapshot
MAX_JUMP = 0.10  # relative price change between consecutive rows of one contract (limit moves are 7%)
MIN_GAP_NS = 60 * 60 * 1_000_000_000  # a gap inside a session is suspicious above max(this, ...
GAP_SPACINGS = 30  # ... this many times the session's mean row spacing (sparse demo files are not)
SESSION_NS = 23 * 60 * 60 * 1_000_000_000  # a CME session: 17:00 to 16:00 CT
MAX_BREAK_NS = 5 * NS_PER_DAY  # no rows at all for this long: sessions are missing (Easter is 3 days)
FEW_ROWS_SHARE = 0.05  # a session (not the file's first or last) with fewer rows than this share of the median
MAX_INVALID_SHARE = 0.05  # snapshots dropped for a crossed, locked or one-sided top of book (pre-open auctions)


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
    return problems + suspicious_rows(sc) + label_tail_problems(sc)


def suspicious_rows(sc: Sidecar) -> list[str]:
    """Legal but suspicious data, which the record checks let through: many snapshots without a valid top
    of book, a spread of over MAX_SPREAD_TICKS, a price jump of over MAX_JUMP between rows of one contract,
    a gap inside a session much longer than the session's spacing, sessions missing for days, or a session
    (not the file's first or last) with very few rows. Each is reported once, at its first row, naming the
    file and the field."""
    name = sc.meta.source.name
    problems = []
    invalid = sc.meta.dropped.get("snapshots_without_valid_top_of_book", 0)
    if invalid > MAX_INVALID_SHARE * (sc.rows + invalid):
        problems.append(f"{name}: {invalid} of {sc.rows + invalid} front-month snapshots have no valid best bid and "
                        f"ask (crossed, locked or one-sided: over {100 * MAX_INVALID_SHARE:.0f}%) and were dropped")
    if sc.meta.kind == BOOK:
        col = sc.meta.feature_names.index("spread_ticks")
        for lo in range(0, sc.rows, BLOCK_ROWS):
            spread = np.asarray(sc.features[lo : lo + BLOCK_ROWS, col])
            if (spread > MAX_SPREAD_TICKS).any():
                i = int(np.argmax(spread > MAX_SPREAD_TICKS))
                problems.append(f"{name}: spread_ticks is {spread[i]:.0f} at row {lo + i}, {_when(sc, lo + i)} "
                                f"(wider than {MAX_SPREAD_TICKS} ticks)")
                break
    sessions: dict[int, int] = {}
    gaps: list[tuple[int, int, int]] = []  # (row, gap ns, session) of gaps inside a session over MIN_GAP_NS
    jump = brk = None
    for lo in range(0, sc.rows, BLOCK_ROWS):
        a = max(lo - 1, 0)  # one row of overlap: differences across the block boundary
        ts = np.asarray(sc.ts[a : lo + BLOCK_ROWS])
        price = np.asarray(sc.price[a : lo + BLOCK_ROWS])
        iid = np.asarray(sc.instrument_id[a : lo + BLOCK_ROWS])
        day = session_days(ts)
        own = day[lo - a :]
        for d, c in zip(*np.unique(own, return_counts=True), strict=True):
            sessions[int(d)] = sessions.get(int(d), 0) + int(c)
        if len(ts) < 2:
            continue
        gap = np.diff(ts)
        inside = day[1:] == day[:-1]
        for k in np.flatnonzero(inside & (gap > MIN_GAP_NS)):
            gaps.append((a + int(k) + 1, int(gap[k]), int(day[k])))
        if brk is None and (gap > MAX_BREAK_NS).any():
            k = int(np.argmax(gap > MAX_BREAK_NS))
            brk = (a + k + 1, int(gap[k]))
        rel = np.abs(np.diff(price)) / np.maximum(np.abs(price[:-1]), np.finfo(np.float64).tiny)
        rel[iid[1:] != iid[:-1]] = 0.0  # a roll: the contract changes (prices are stitched there anyway)
        if jump is None and (rel > MAX_JUMP).any():
            k = int(np.argmax(rel > MAX_JUMP))
            jump = (a + k + 1, float(rel[k]))
    if jump is not None:
        i, rel = jump
        problems.append(f"{name}: price jumps {100 * rel:.1f}% at row {i}, {_when(sc, i)}, within one contract "
                        f"(more than {100 * MAX_JUMP:.0f}%)")
    if brk is not None:
        i, gap = brk
        problems.append(f"{name}: ts has no rows for {gap / NS_PER_DAY:.1f} days before row {i}, {_when(sc, i)} "
                        "(sessions missing)")
    for i, gap, day in gaps:
        allowed = max(MIN_GAP_NS, GAP_SPACINGS * SESSION_NS // sessions[day])
        if gap > allowed:
            problems.append(f"{name}: ts has no rows for {gap / 60e9:.0f} min inside session {_day(day)} before row "
                            f"{i}, {_when(sc, i)} (over {allowed / 60e9:.0f} min for its {sessions[day]} rows)")
            break
    inner = sorted(sessions)[1:-1]
    if inner:
        typical = float(np.median(list(sessions.values())))
        few = [d for d in inner if sessions[d] < FEW_ROWS_SHARE * typical]
        if few:
            problems.append(f"{name}: session {_day(few[0])} has {sessions[few[0]]} rows, under "
                            f"{100 * FEW_ROWS_SHARE:.0f}% of the median session ({typical:.0f} rows)")
    return problems


def _when(sc: Sidecar, row: int) -> str:
    return dt.datetime.fromtimestamp(int(sc.ts[row]) / 1e9, tz=dt.UTC).isoformat()


def _day(day: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()


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
