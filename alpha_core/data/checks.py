"""Integrity checks of built sidecars: what the Dagster gates and `alpha predecode` verify.

Every check streams: a sidecar is read in blocks of BLOCK_ROWS rows (`Sidecar.read`, plain reads, nothing
memory-mapped), so the memory a check takes is one block whatever the file's size, and nothing it read stays in
the process's resident set afterwards. What a check needs across a block boundary is carried: the previous row,
the rows per session, and for bar labels the rows up to the longest horizon after the block.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator

import numpy as np

from alpha_core.data.labels import NS_PER_MINUTE
from alpha_core.data.products import product
from alpha_core.data.sidecar import BOOK, Sidecar
from alpha_core.errors import DataError
from alpha_core.sessions import NS_PER_DAY, session_days

BLOCK_ROWS = 1 << 15  # rows per block: about 4 MB of book features (float16)
# legal but suspicious data (a failed check, not an error): thresholds far outside what CME data shows
MAX_SPREAD_TICKS = 1000  # best ask - best bid of a front-month snapshot
MAX_JUMP = 0.10  # relative price change between consecutive rows of one contract (limit moves are 7%)
MIN_GAP_NS = 60 * 60 * 1_000_000_000  # a gap inside a session is suspicious above max(this, ...
GAP_SPACINGS = 30  # ... this many times the session's mean row spacing (sparse demo files are not)
SESSION_NS = 23 * 60 * 60 * 1_000_000_000  # a CME session: 17:00 to 16:00 CT
MAX_BREAK_NS = 5 * NS_PER_DAY  # no rows at all for this long: sessions are missing (Easter is 3 days)
FEW_ROWS_SHARE = 0.05  # a session (not the file's first or last) with fewer rows than this share of the median
MAX_INVALID_SHARE = 0.05  # snapshots dropped for a crossed, locked or one-sided top of book (pre-open auctions)


def _blocks(sc: Sidecar, names: tuple[str, ...], back: int = 0) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
    """(lo, hi, arrays) per block of rows [lo, hi); each array holds rows [max(lo - back, 0), hi)."""
    for lo in range(0, sc.rows, BLOCK_ROWS):
        hi = min(lo + BLOCK_ROWS, sc.rows)
        yield lo, hi, {name: sc.read(name, lo - back, hi) for name in names}


def sidecar_problems(sc: Sidecar) -> list[str]:
    """Monotonic time, an uncrossed book, finite features, labels NaN only where a horizon leaves the file."""
    problems = []
    name = sc.meta.source.name
    col = sc.meta.feature_names.index("spread_ticks" if sc.meta.kind == BOOK else "log_range")
    backwards = nonfinite = wide = None
    bad_book = 0
    for lo, _, a in _blocks(sc, ("ts", "features"), back=1):
        ts, features = a["ts"], a["features"][min(lo, 1) :]
        if backwards is None and (np.diff(ts) < 0).any():
            backwards = max(lo - 1, 0) + int(np.argmax(np.diff(ts) < 0)) + 1
        spread = features[:, col]
        bad_book += int(np.count_nonzero(spread <= 0 if sc.meta.kind == BOOK else spread < 0))
        if sc.meta.kind == BOOK and wide is None and (spread > MAX_SPREAD_TICKS).any():
            i = int(np.argmax(spread > MAX_SPREAD_TICKS))
            wide = (lo + i, float(spread[i]))
        if nonfinite is None and not np.isfinite(features).all():
            nonfinite = lo
    if backwards is not None:
        problems.append(f"{name}: timestamps go backwards at row {backwards}")
    if bad_book:
        problems.append(f"{name}: {bad_book} rows with a crossed/locked book or low > high")
    if nonfinite is not None:
        problems.append(f"{name}: non-finite feature values from row {nonfinite}")
    return problems + suspicious_rows(sc, wide=wide or False) + label_tail_problems(sc)


def suspicious_rows(sc: Sidecar, wide: tuple[int, float] | bool | None = None) -> list[str]:
    """Legal but suspicious data, which the record checks let through: many snapshots without a valid top
    of book, a spread of over MAX_SPREAD_TICKS, a price jump of over MAX_JUMP between rows of one contract,
    a gap inside a session much longer than the session's spacing, sessions missing for days, or a session
    (not the file's first or last) with very few rows. Each is reported once, at its first row, naming the
    file and the field. `wide`: the first wide spread (row, ticks), or False for none, when a pass over the
    features has looked already (`sidecar_problems`)."""
    name = sc.meta.source.name
    problems = []
    invalid = sc.meta.dropped.get("snapshots_without_valid_top_of_book", 0)
    if invalid > MAX_INVALID_SHARE * (sc.rows + invalid):
        problems.append(
            f"{name}: {invalid} of {sc.rows + invalid} front-month snapshots have no valid best bid and "
            f"ask (crossed, locked or one-sided: over {100 * MAX_INVALID_SHARE:.0f}%) and were dropped"
        )
    book = sc.meta.kind == BOOK
    col = sc.meta.feature_names.index("spread_ticks") if book else None
    sessions: dict[int, int] = {}
    gaps: dict[int, list[tuple[int, int]]] = {}  # session -> (row, gap ns) inside it over MIN_GAP_NS, until it ends
    jump = brk = long_gap = None
    look = book and wide is None  # read the spreads here
    for lo, _, a in _blocks(sc, ("ts", "price", "instrument_id"), back=1):
        a0 = max(lo - 1, 0)  # one row of overlap: differences across the block boundary
        ts, price, iid = a["ts"], a["price"], a["instrument_id"]
        if look and not wide:
            spread = sc.read("features", lo, lo + BLOCK_ROWS)[:, col]
            if (spread > MAX_SPREAD_TICKS).any():
                i = int(np.argmax(spread > MAX_SPREAD_TICKS))
                wide = (lo + i, float(spread[i]))
        day = session_days(ts)
        own = day[lo - a0 :]
        for d, c in zip(*np.unique(own, return_counts=True), strict=True):
            sessions[int(d)] = sessions.get(int(d), 0) + int(c)
        if len(ts) < 2:
            continue
        gap = np.diff(ts)
        inside = day[1:] == day[:-1]
        for k in np.flatnonzero(inside & (gap > MIN_GAP_NS)) if long_gap is None else ():
            gaps.setdefault(int(day[k]), []).append((a0 + int(k) + 1, int(gap[k])))
        long_gap = long_gap or _long_gap(gaps, sessions, before=int(day[-1]))  # sessions before this one are whole
        if brk is None and (gap > MAX_BREAK_NS).any():
            k = int(np.argmax(gap > MAX_BREAK_NS))
            brk = (a0 + k + 1, int(gap[k]))
        rel = np.abs(np.diff(price)) / np.maximum(np.abs(price[:-1]), np.finfo(np.float64).tiny)
        rel[iid[1:] != iid[:-1]] = 0.0  # a roll: the contract changes (prices are stitched there anyway)
        if jump is None and (rel > MAX_JUMP).any():
            k = int(np.argmax(rel > MAX_JUMP))
            jump = (a0 + k + 1, float(rel[k]))
    if wide:
        i, spread = wide
        problems.append(
            f"{name}: spread_ticks is {spread:.0f} at row {i}, {_when(sc, i)} (wider than {MAX_SPREAD_TICKS} ticks)"
        )
    if jump is not None:
        i, rel = jump
        problems.append(
            f"{name}: price jumps {100 * rel:.1f}% at row {i}, {_when(sc, i)}, within one contract "
            f"(more than {100 * MAX_JUMP:.0f}%)"
        )
    if brk is not None:
        i, gap = brk
        problems.append(
            f"{name}: ts has no rows for {gap / NS_PER_DAY:.1f} days before row {i}, {_when(sc, i)} (sessions missing)"
        )
    long_gap = long_gap or _long_gap(gaps, sessions, before=None)
    if long_gap is not None:
        i, gap, day, allowed = long_gap
        problems.append(
            f"{name}: ts has no rows for {gap / 60e9:.0f} min inside session {_day(day)} before row "
            f"{i}, {_when(sc, i)} (over {allowed / 60e9:.0f} min for its {sessions[day]} rows)"
        )
    inner = sorted(sessions)[1:-1]
    if inner:
        typical = float(np.median(list(sessions.values())))
        few = [d for d in inner if sessions[d] < FEW_ROWS_SHARE * typical]
        if few:
            problems.append(
                f"{name}: session {_day(few[0])} has {sessions[few[0]]} rows, under "
                f"{100 * FEW_ROWS_SHARE:.0f}% of the median session ({typical:.0f} rows)"
            )
    return problems


def _long_gap(
    gaps: dict[int, list[tuple[int, int]]], sessions: dict[int, int], before: int | None
) -> tuple[int, int, int, int] | None:
    """The first gap longer than its session allows, among the sessions before `before` (all: None), whose row
    counts are final; their gaps are let go, so only the current session's are held."""
    for day in sorted(d for d in gaps if before is None or d < before):
        allowed = max(MIN_GAP_NS, GAP_SPACINGS * SESSION_NS // sessions[day])
        for row, gap in gaps.pop(day):
            if gap > allowed:
                gaps.clear()
                return row, gap, day, allowed
    return None


def _when(sc: Sidecar, row: int) -> str:
    return dt.datetime.fromtimestamp(int(sc.read("ts", row, row + 1)[0]) / 1e9, tz=dt.UTC).isoformat()


def _day(day: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()


def expected_nan(sc: Sidecar, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """bool [hi - lo, H] twice: where rows [lo, hi) may have no outcome label, and no direction label.

    No outcome label where the horizon runs past the end of the file or, for bars, no bar follows the row up
    to its horizon (no trade after its close: no price to label with). No direction label there too and, for
    bars, where the price at the horizon equals the row's own (no move, `alpha_core.data.labels`). Bars read
    the rows up to the longest horizon after the block."""
    horizons = sc.meta.horizons
    n = hi - lo
    if sc.meta.kind == BOOK:
        tail = np.stack([np.arange(lo, hi) >= sc.rows - h for h in horizons], axis=1)
        return tail, tail
    reach = max(horizons) * NS_PER_MINUTE
    end = hi
    ts = sc.read("ts", lo, hi)
    while end < sc.rows and int(ts[-1]) <= int(ts[n - 1]) + reach:  # read on to the rows the horizons reach
        more = sc.read("ts", end, end + BLOCK_ROWS)
        ts, end = np.concatenate([ts, more]), end + len(more)
    price = sc.read("price", lo, end)
    own = np.arange(n)
    tail = np.empty((n, len(horizons)), dtype=bool)
    flat = np.empty_like(tail)
    for j, h in enumerate(horizons):
        target = ts[:n] + h * NS_PER_MINUTE
        future = np.searchsorted(ts, target, side="right") - 1  # the last bar starting at or before the horizon
        tail[:, j] = (target > sc.meta.last_ts) | (future <= own)
        flat[:, j] = ~tail[:, j] & (price[np.maximum(future, 0)] == price[:n])
    return tail, tail | flat


def label_tail_problems(sc: Sidecar) -> list[str]:
    """Labels must be NaN exactly where `expected_nan` says: none crosses a boundary, none is made up."""
    wrong: dict[str, tuple[int, int]] = {}
    for lo, hi, a in _blocks(sc, ("labels", "outcome_long", "outcome_short")):
        if len(wrong) == 3:
            break
        outcome, direction = expected_nan(sc, lo, hi)
        for arr_name in ("labels", "outcome_long", "outcome_short"):
            expected = direction if arr_name == "labels" else outcome
            off = np.isnan(a[arr_name]) != expected
            if arr_name not in wrong and off.any():
                row, h = np.argwhere(off)[0]
                wrong[arr_name] = (lo + int(row), int(h))
    return [
        f"{sc.meta.source.name}: {arr_name} NaN pattern wrong at row {row}, horizon {sc.meta.horizons[h]}"
        for arr_name in ("labels", "outcome_long", "outcome_short")
        if arr_name in wrong
        for row, h in [wrong[arr_name]]
    ]


def check_continuity(sidecars: list[Sidecar]) -> None:
    """Refuse a symbol's file set in which the reference price (the front month's mid, or close) jumps from the end
    of one file to the start of the next by more than the product's `max_file_move` (a file of doubled prices, say),
    naming both files and the field. `sidecars` in time order; each schema is its own series. The prices compared are
    the sidecars' (stitched at rolls inside a file: a carry, far under the bound)."""
    last: dict[str, Sidecar] = {}
    for sc in sidecars:
        if sc.rows == 0:
            continue
        before, last[sc.meta.kind] = last.get(sc.meta.kind), sc
        if before is None:
            continue
        end, start = float(before.read("price", before.rows - 1, before.rows)[0]), float(sc.read("price", 0, 1)[0])
        bound = product(sc.meta.symbol).max_file_move
        if end > 0 and start > 0 and abs(math.log(start / end)) > math.log(bound):
            field = "mid (front month)" if sc.meta.kind == BOOK else "close (front month)"
            raise DataError(
                sc.meta.source.path,
                f"{field} starts at {start:g}, {start / end:.2f} times where the previous file {before.meta.source.path} "
                f"ends ({end:g}): more than the factor {bound:g} that {sc.meta.symbol} moves between consecutive files "
                f"(wrong prices in one of the two)",
            )
