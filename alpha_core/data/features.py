"""Vectorised features of the front-month book and bar series (numpy/polars, no loop over rows).

Prices become ticks or log ratios so the features are stationary and comparable across products;
the price level itself is kept apart as the sidecar's reference price. Missing levels contribute
zero size, so an empty level never turns into a huge number.

The series arrive in consecutive chunks (`series.BookSource.chunks`), so `BookFeatures` and
`BarFeatures` carry what a row needs from the rows before it: the previous snapshot or bar (time, mid
or close, contract, the stitch offset at rolls) and, for bars, the tail of the rolling windows. Every
value is the one the whole series would give at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from alpha_core.data.front_month import Stitcher
from alpha_core.data.series import N_LEVELS, BarChunk, BookChunk
from alpha_core.sessions import SESSION_TZ

FIXED = 1e9

BOOK_FEATURES: tuple[str, ...] = (
    "spread_ticks",
    "microprice_offset_ticks",
    "mid_change_ticks",
    *(f"imbalance_{k}" for k in range(1, N_LEVELS + 1)),
    *(f"bid_size_share_{i}" for i in range(N_LEVELS)),
    *(f"ask_size_share_{i}" for i in range(N_LEVELS)),
    *(f"bid_count_share_{i}" for i in range(N_LEVELS)),
    *(f"ask_count_share_{i}" for i in range(N_LEVELS)),
    "log_depth",
    "trade_imbalance",
    "log_trade_volume",
    "log_dt_ms",
)

BAR_FEATURES: tuple[str, ...] = (
    "log_return",
    "log_range",
    "log_body",
    "return_5",
    "return_15",
    "realized_vol_30",
    "volume_z_60",
    "log_gap_minutes",
    "tod_sin",
    "tod_cos",
    "is_rth",
    "session_progress",
    "is_session_first_bar",
)


@dataclass
class Features:
    """Features of one chunk of the series, with the arrays that go beside them into the sidecar."""

    names: tuple[str, ...]
    values: np.ndarray  # float32 [n, F]
    ts: np.ndarray  # int64
    price_fixed: np.ndarray  # int64 stitched reference price, price = price_fixed / price_scale
    price_scale: float
    dt: np.ndarray  # float32 seconds since the previous row (0 for the first row of the file)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def _ratio_into(out: np.ndarray, num: np.ndarray, den: np.ndarray) -> None:
    """`out[...] = _ratio(num, den)` without the temporaries (the same float operations, so the same values)."""
    out[...] = 0
    np.divide(num, den, out=out, where=den > 0)


def _previous(values: np.ndarray, before: object | None) -> np.ndarray:
    """`values` shifted by one row: the last value of the previous chunk first (the row itself at the file's start)."""
    first = values[:1] if before is None else np.asarray([before], dtype=values.dtype)
    return np.concatenate((first, values[:-1]))


BOOK_BLOCK_ROWS = 4_096  # rows of the [n, F] book features built at a time, so every pass stays in cache
# columns the [F, rows] block is allocated wider by: `__call__` copies it transposed, down its columns, and a row
# stride of a power of two (16 KiB) puts every row in the same cache sets (that copy took 10x longer)
_BLOCK_PAD = 16
_EXACT_F32_INT = 2**24  # float32 sums of non-negative integers below this are exact in any order


class BookFeatures:
    """Book features of consecutive chunks of the front-month snapshots; carries the previous snapshot."""

    names = BOOK_FEATURES
    price_scale = 2.0 * FIXED  # the reference price is 2 x mid, an exact integer

    def __init__(self, tick_size: float) -> None:
        self.tick_fixed = tick_size * FIXED
        self.stitch = Stitcher()
        self._ts: int | None = None  # the previous snapshot's ts_recv and stitched 2 x mid
        self._mid2: int | None = None

    def __call__(self, chunk: BookChunk) -> Features:
        columns, mid2, dt = self._columns(chunk)
        values = np.empty((len(chunk.ts), len(BOOK_FEATURES)), dtype=np.float32)
        for lo, block in _book_blocks(chunk, columns):
            values[lo : lo + block.shape[1]] = block.T
        return Features(BOOK_FEATURES, values, chunk.ts, mid2, self.price_scale, dt.astype(np.float32))

    def _columns(self, chunk: BookChunk) -> tuple[dict[int, np.ndarray], np.ndarray, np.ndarray]:
        """The per-row (float64) book features by column index, the stitched 2 x mid and dt in seconds."""
        col = {name: i for i, name in enumerate(BOOK_FEATURES)}
        tick_fixed = self.tick_fixed
        bid, ask = chunk.bid_px.astype(np.float64), chunk.ask_px.astype(np.float64)
        bsz0, asz0 = chunk.bid_sz[:, 0].astype(np.float64), chunk.ask_sz[:, 0].astype(np.float64)
        mid2 = self.stitch(chunk.bid_px + chunk.ask_px, chunk.instrument_id)  # 2 x mid, exact integer
        buys, sells = chunk.buy_volume, chunk.sell_volume
        dt = (chunk.ts - _previous(chunk.ts, self._ts)).astype(np.float64) / 1e9
        columns = {
            col["spread_ticks"]: (ask - bid) / tick_fixed,
            col["microprice_offset_ticks"]: _ratio((ask - bid) * (bsz0 - asz0), 2.0 * (bsz0 + asz0)) / tick_fixed,
            col["mid_change_ticks"]: (mid2 - _previous(mid2, self._mid2)) / (2.0 * tick_fixed),
            col["trade_imbalance"]: _ratio(buys - sells, buys + sells),
            col["log_trade_volume"]: np.log1p(buys + sells),
            col["log_dt_ms"]: np.log1p(dt * 1e3),
        }
        self._ts, self._mid2 = int(chunk.ts[-1]), int(mid2[-1])
        return columns, mid2, dt


def _book_blocks(chunk: BookChunk, columns: dict[int, np.ndarray]) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (first row, float32 [F, rows]) blocks of the book features; a block is reused by the next one.

    Feature-major, so every operation runs over contiguous rows, and small enough to stay in cache. The
    float32 operations are those of `cumsum` / `_ratio` on the [n, 10] level arrays (a cumsum is a
    sequential float32 sum), so the values are the same, without any [n, 10] temporary.
    """
    n = len(chunk.ts)
    col = {name: i for i, name in enumerate(BOOK_FEATURES)}
    imb, shares, log_depth = col["imbalance_1"], col["bid_size_share_0"], col["log_depth"]
    assert BOOK_FEATURES[shares : shares + 4 * N_LEVELS] == tuple(  # the four share blocks, in book order
        f"{side}_{what}_share_{i}" for what in ("size", "count") for side in ("bid", "ask") for i in range(N_LEVELS)
    )
    block_rows = max(1, min(BOOK_BLOCK_ROWS, n))
    res_buf = np.empty((len(BOOK_FEATURES), block_rows + _BLOCK_PAD), dtype=np.float32)
    cum_buf = np.empty((2, N_LEVELS, block_rows), dtype=np.float32)
    for lo in range(0, n, block_rows):
        hi = min(lo + block_rows, n)
        m = hi - lo
        res, cum = res_buf[:, :m], cum_buf[:, :, :m]
        book = chunk.levels[:, :, lo:hi]  # bid sz, ask sz, bid ct, ask ct [4, 10, m]: feature-major already
        cum[:, 0] = book[:2, 0]  # float32 cumsum over the levels, bid and ask
        for i in range(1, N_LEVELS):
            np.add(cum[:, i - 1], book[:2, i], out=cum[:, i])
        depth = cum[0, -1] + cum[1, -1]
        counts = book[2, 0] + book[3, 0]
        for i in range(1, N_LEVELS):
            counts += book[2, i]
            counts += book[3, i]
        if counts.max(initial=0) >= _EXACT_F32_INT:  # order-dependent rounding: sum as numpy does over [m, 10] rows
            counts = np.ascontiguousarray(chunk.bid_ct[lo:hi]).sum(axis=1) + np.ascontiguousarray(chunk.ask_ct[lo:hi]).sum(
                axis=1
            )
        _ratio_into(res[imb : imb + N_LEVELS], cum[0] - cum[1], cum[0] + cum[1])
        share = res[shares : shares + 4 * N_LEVELS].reshape(4, N_LEVELS, m)
        _ratio_into(share[:2], book[:2], depth)
        _ratio_into(share[2:], book[2:], counts)
        np.log1p(depth, out=res[log_depth])  # elementwise, contiguous: as on the whole column
        for i, column in columns.items():
            res[i] = column[lo:hi]
        yield lo, res


BAR_WINDOW_TAIL = 59  # rows of the longest rolling window (60 bars) before a block's first bar


class BarFeatures:
    """Bar features of consecutive blocks of front-month bars; carries the previous bar and the window tails.

    The rolling sums of polars are incremental (compensated), so a block's first rows start them from the
    carried tail instead of from the file's first bar: equal to the whole-series values within float
    rounding, and bit for bit the same when the file fits in one block (`series.BAR_BLOCK_ROWS` bars).
    """

    names = BAR_FEATURES
    price_scale = FIXED

    def __init__(self) -> None:
        self.stitch = Stitcher()
        self._first_ts: int | None = None  # the origin of the minute count
        self._last: tuple[int, int, float, int, int] | None = None  # ts, contract, log close, minute, session day
        self._tail = np.empty((2, 0))  # the last BAR_WINDOW_TAIL log returns and log volumes

    def __call__(self, bars: BarChunk) -> Features:
        import polars as pl  # here, not at the top: the book build (`alpha predecode` of MBP-10) never needs it

        if self._first_ts is None:
            self._first_ts = int(bars.ts[0])
        ts_0, iid_0, log_close_0, minute_0, day_0 = self._last or (None,) * 5
        close = self.stitch(bars.close, bars.instrument_id)
        same_contract = bars.instrument_id == _previous(bars.instrument_id, iid_0)
        if self._last is None:
            same_contract[0] = False
        log_close = np.log(bars.close.astype(np.float64))
        log_return = np.where(same_contract, log_close - _previous(log_close, log_close_0), 0.0)
        minutes = (bars.ts - self._first_ts) // 60_000_000_000
        gap = minutes - _previous(minutes, minutes[0] - 1 if minute_0 is None else minute_0) - 1  # minutes without a bar

        local = pl.from_epoch(pl.Series(bars.ts), time_unit="ns").dt.replace_time_zone("UTC")
        local = local.dt.convert_time_zone(SESSION_TZ)
        minute_of_day = (local.dt.hour().cast(pl.Int32) * 60 + local.dt.minute().cast(pl.Int32)).to_numpy()
        session_minute = (minute_of_day - 17 * 60) % 1440  # the session opens at 17:00 CT
        session_day = local.dt.offset_by("7h").dt.date().cast(pl.Int32).to_numpy()
        first_of_session = session_day != _previous(session_day, day_0)
        if day_0 is None:
            first_of_session[0] = True

        tail = self._tail.shape[1]
        r, logv = np.concatenate((self._tail[0], log_return)), np.concatenate((self._tail[1], np.log1p(bars.volume)))
        frame = pl.DataFrame({"r": r, "logv": logv}).with_columns(
            pl.col("r").rolling_sum(5, min_samples=1).alias("r5"),
            pl.col("r").rolling_sum(15, min_samples=1).alias("r15"),
            (pl.col("r") ** 2).rolling_sum(30, min_samples=1).sqrt().alias("rv30"),
            pl.col("logv").rolling_mean(60, min_samples=1).alias("vmean"),
            pl.col("logv").rolling_std(60, min_samples=2).fill_null(0.0).alias("vstd"),
        )
        vz = (frame["logv"] - frame["vmean"]) / (frame["vstd"] + 1e-3)
        angle = 2.0 * np.pi * minute_of_day / 1440.0
        columns = [
            log_return,
            np.log(bars.high / bars.low.astype(np.float64)),
            np.log(bars.close / bars.open.astype(np.float64)),
            frame["r5"].to_numpy()[tail:],
            frame["r15"].to_numpy()[tail:],
            frame["rv30"].to_numpy()[tail:],
            vz.to_numpy()[tail:],
            np.log1p(gap),
            np.sin(angle),
            np.cos(angle),
            ((minute_of_day >= 8 * 60 + 30) & (minute_of_day < 15 * 60)).astype(np.float64),
            session_minute / 1380.0,
            first_of_session.astype(np.float64),
        ]
        values = np.stack([np.asarray(c, dtype=np.float32) for c in columns], axis=1)
        dt = ((bars.ts - _previous(bars.ts, ts_0)) / 1e9).astype(np.float32)
        self._last = (
            int(bars.ts[-1]),
            int(bars.instrument_id[-1]),
            float(log_close[-1]),
            int(minutes[-1]),
            int(session_day[-1]),
        )
        self._tail = np.stack([r, logv])[:, -BAR_WINDOW_TAIL:]
        return Features(BAR_FEATURES, values, bars.ts, close, FIXED, dt)
