"""Pick the front-month contract per CME trading session, without look-ahead, and stitch prices.

A parent symbol (ES.FUT) covers several outright contracts at once. For each trading session
(America/Chicago; a session opens at 17:00 CT the evening before its date) the front month is the
contract that was most active in the *previous* session (volume for bars, record count for the
book), so no decision uses data not yet seen. The file's first session has no previous one: it
takes the nearest-expiring contract that trades in it. The choice never rolls back to an earlier
expiry. Prices of consecutive contracts differ by the carry, so `stitch` removes the jump at each
roll (later segments shifted, earlier prices untouched: nothing is adjusted with future data).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np

from alpha_core.data.products import parse_contract


def _easter(year: int) -> dt.date:
    """Gregorian Easter Sunday (the anonymous Gregorian algorithm); Good Friday is two days before."""
    a, b, c = year % 19, year // 100, year % 100
    d, e = divmod(b, 4)
    g = (8 * b + 13) // 25
    h = (19 * a + b - d - g + 15) % 30
    i, k = divmod(c, 4)
    m = (32 + 2 * e + 2 * i - h - k) % 7
    n = h + m - 7 * ((a + 11 * h + 22 * m) // 451) + 114
    return dt.date(year, n // 31, n % 31 + 1)


def cme_holidays(year: int) -> set[dt.date]:
    """Weekdays without a full session: New Year's Day, Good Friday, Independence Day, Thanksgiving, Christmas
    (CME closes or cuts these short): the demo drops them, and a gap report does not count them as missing."""
    nov1 = dt.date(year, 11, 1)
    thanksgiving = nov1 + dt.timedelta(days=(3 - nov1.weekday()) % 7 + 21)
    return {dt.date(year, 1, 1), _easter(year) - dt.timedelta(days=2), dt.date(year, 7, 4), thanksgiving, dt.date(year, 12, 25)}


@dataclass(frozen=True)
class Roll:
    session: str  # ISO date of the first session on the new contract
    from_contract: str
    to_contract: str


@dataclass(frozen=True)
class FrontMonth:
    front_by_session: dict[int, int]  # session day -> instrument_id
    rolls: list[Roll]

    def mask(self, sessions: np.ndarray, instrument_ids: np.ndarray) -> np.ndarray:
        """True for rows that belong to their session's front contract."""
        days = np.fromiter(self.front_by_session, dtype=np.int64, count=len(self.front_by_session))
        fronts = np.fromiter(self.front_by_session.values(), dtype=np.int64, count=len(days))
        order = np.argsort(days)
        days, fronts = days[order], fronts[order]
        pos = np.clip(np.searchsorted(days, sessions), 0, len(days) - 1)
        return (days[pos] == sessions) & (fronts[pos] == instrument_ids)


def choose_front(
    sessions: np.ndarray, instrument_ids: np.ndarray, activity: np.ndarray, symbols: dict[int, str], ref_year: int
) -> FrontMonth:
    """Front contract per session from per-row activity (1 per record, or the bar volume)."""
    pairs, inverse = np.unique(
        np.stack([sessions.astype(np.int64), instrument_ids.astype(np.int64)], axis=1), axis=0, return_inverse=True
    )
    totals = np.bincount(inverse.reshape(-1), weights=np.asarray(activity, dtype=np.float64), minlength=len(pairs))
    expiry = {iid: parse_contract(sym).expiry_key(ref_year) for iid, sym in symbols.items()}
    by_session: dict[int, dict[int, float]] = {}
    for (session, iid), act in zip(pairs.tolist(), totals.tolist(), strict=True):
        by_session.setdefault(session, {})[iid] = act

    front: dict[int, int] = {}
    rolls: list[Roll] = []
    current: int | None = None
    previous_active: dict[int, float] | None = None
    for session in sorted(by_session):
        active = by_session[session]
        if previous_active is None:
            wanted = min(active, key=lambda i: expiry[i])
        else:
            wanted = max(previous_active, key=lambda i: (previous_active[i], -expiry[i]))
        if current is not None and expiry[wanted] < expiry[current]:
            wanted = current  # never roll back to an earlier expiry
        # the wanted contract may not trade this session (e.g. it expired): take the next one that does
        later = [i for i in active if expiry[i] >= expiry[wanted]]
        chosen = min(later, key=lambda i: expiry[i]) if later else wanted
        if current is not None and chosen != current:
            day = np.datetime64(int(session), "D").astype(str)
            rolls.append(Roll(day, symbols[current], symbols[chosen]))
        front[session] = current = chosen
        previous_active = active
    return FrontMonth(front, rolls)


def stitch(price: np.ndarray, instrument_ids: np.ndarray) -> np.ndarray:
    """Continuous price: each later contract segment is shifted so the roll adds no jump.

    Works in the input's dtype; pass integer fixed-point prices to keep equal prices exactly equal.
    """
    out = price.copy()
    roll_rows = np.flatnonzero(instrument_ids[1:] != instrument_ids[:-1]) + 1
    if len(roll_rows) == 0:
        return out
    offsets = np.zeros(len(out), dtype=price.dtype)
    offsets[roll_rows] = price[roll_rows - 1] - price[roll_rows]
    return out + np.cumsum(offsets)


class Stitcher:
    """`stitch` over consecutive chunks of one series: carries the last price, its contract and the offset."""

    def __init__(self) -> None:
        self._last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # price, instrument id, offset

    def __call__(self, price: np.ndarray, instrument_ids: np.ndarray) -> np.ndarray:
        if self._last is None:
            out = stitch(price, instrument_ids)
        else:
            last_price, last_id, offset = self._last
            out = stitch(np.concatenate((last_price, price)), np.concatenate((last_id, instrument_ids)))[1:] + offset
        self._last = (price[-1:].copy(), instrument_ids[-1:].copy(), out[-1:] - price[-1:])
        return out
