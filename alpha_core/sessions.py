"""The CME session calendar: a session opens at 17:00 America/Chicago the evening before its date. One module for
every layer that counts sessions (the front month, the daily PnL of the metrics, the report's axes)."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import numpy as np

SESSION_TZ = "America/Chicago"
SESSION_OPEN_SHIFT_H = 7  # 17:00 CT + 7 h = 00:00 of the session's date


NS_PER_HOUR = 3_600_000_000_000
NS_PER_DAY = 24 * NS_PER_HOUR


def session_days(ts_ns: np.ndarray) -> np.ndarray:
    """CME session date of each UTC ns timestamp, as int32 days since 1970-01-01.

    Chicago's UTC offset only changes on whole hours, so it is looked up once per distinct hour
    (a few thousand per quarter) and applied to every timestamp of that hour.
    """
    ts = np.asarray(ts_ns, dtype=np.int64)
    hours, inverse = np.unique(ts // NS_PER_HOUR, return_inverse=True)
    tz = ZoneInfo(SESSION_TZ)
    offsets = (
        np.array([dt.datetime.fromtimestamp(int(h) * 3600, tz=tz).utcoffset().total_seconds() for h in hours], dtype=np.int64)
        * 1_000_000_000
    )
    local = ts + offsets[inverse.reshape(-1)] + SESSION_OPEN_SHIFT_H * NS_PER_HOUR
    return (local // NS_PER_DAY).astype(np.int32)


def session_day(ts_ns: int) -> dt.date:
    """The CME session date of one UTC ns timestamp (`session_days`)."""
    return dt.date(1970, 1, 1) + dt.timedelta(days=int(session_days(np.array([ts_ns]))[0]))


def session_open_ns(day: dt.date) -> int:
    """When the session of `day` opens: 17:00 CT the evening before, in UTC ns."""
    eve = day - dt.timedelta(days=1)
    return int(dt.datetime(eve.year, eve.month, eve.day, 17, tzinfo=ZoneInfo(SESSION_TZ)).timestamp()) * 1_000_000_000
