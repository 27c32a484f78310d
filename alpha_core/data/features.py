"""Vectorised features of the front-month book and bar series (numpy/polars, no loop over rows).

Prices become ticks or log ratios so the features are stationary and comparable across products;
the price level itself is kept apart as the sidecar's reference price. Missing levels contribute
zero size, so an empty level never turns into a huge number.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from alpha_core.data.front_month import SESSION_TZ, stitch
from alpha_core.data.series import N_LEVELS, BarSeries, BookSeries

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
    names: tuple[str, ...]
    values: np.ndarray  # float32 [N, F]
    ts: np.ndarray  # int64
    price_fixed: np.ndarray  # int64 stitched reference price, price = price_fixed / price_scale
    price_scale: float
    dt: np.ndarray  # float32 seconds since the previous row (0 for the first)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def _ratio_into(out: np.ndarray, num: np.ndarray, den: np.ndarray) -> None:
    """`out[...] = _ratio(num, den)` without the temporaries (the same float operations, so the same values)."""
    out[...] = 0
    np.divide(num, den, out=out, where=den > 0)


BOOK_BLOCK_ROWS = 4_096  # rows of the [N, F] book features built at a time, so every pass stays in cache
_EXACT_F32_INT = 2**24  # float32 sums of non-negative integers below this are exact in any order


def _book_columns(series: BookSeries, tick_size: float) -> tuple[dict[int, np.ndarray], np.ndarray, np.ndarray]:
    """The per-row (float64) book features by column index, the stitched 2 x mid and dt in seconds."""
    col = {name: i for i, name in enumerate(BOOK_FEATURES)}
    tick_fixed = tick_size * FIXED
    bid, ask = series.bid_px.astype(np.float64), series.ask_px.astype(np.float64)
    bsz0, asz0 = series.bid_sz[:, 0].astype(np.float64), series.ask_sz[:, 0].astype(np.float64)
    mid2 = series.bid_px + series.ask_px  # 2 x mid, exact integer
    mid2 = stitch(mid2, series.instrument_id)
    buys, sells = series.buy_volume, series.sell_volume
    dt = np.diff(series.ts, prepend=series.ts[:1]).astype(np.float64) / 1e9
    columns = {
        col["spread_ticks"]: (ask - bid) / tick_fixed,
        col["microprice_offset_ticks"]: _ratio((ask - bid) * (bsz0 - asz0), 2.0 * (bsz0 + asz0)) / tick_fixed,
        col["mid_change_ticks"]: np.diff(mid2, prepend=mid2[:1]) / (2.0 * tick_fixed),
        col["trade_imbalance"]: _ratio(buys - sells, buys + sells),
        col["log_trade_volume"]: np.log1p(buys + sells),
        col["log_dt_ms"]: np.log1p(dt * 1e3),
    }
    return columns, mid2, dt


def _book_blocks(series: BookSeries, columns: dict[int, np.ndarray]) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (first row, float32 [F, rows]) blocks of the book features; a block is reused by the next one.

    Feature-major, so every operation runs over contiguous rows, and small enough to stay in cache. The
    float32 operations are those of `cumsum` / `_ratio` on the [N, 10] level arrays (a cumsum is a
    sequential float32 sum), so the values are the same, without any [N, 10] temporary.
    """
    n = len(series.ts)
    col = {name: i for i, name in enumerate(BOOK_FEATURES)}
    imb, shares, log_depth = col["imbalance_1"], col["bid_size_share_0"], col["log_depth"]
    assert BOOK_FEATURES[shares : shares + 4 * N_LEVELS] == tuple(  # the four share blocks, in book order
        f"{side}_{what}_share_{i}" for what in ("size", "count") for side in ("bid", "ask") for i in range(N_LEVELS)
    )
    block_rows = max(1, min(BOOK_BLOCK_ROWS, n))
    res_buf = np.empty((len(BOOK_FEATURES), block_rows), dtype=np.float32)
    book_buf = np.empty((4, N_LEVELS, block_rows), dtype=np.float32)
    cum_buf = np.empty((2, N_LEVELS, block_rows), dtype=np.float32)
    for lo in range(0, n, block_rows):
        hi = min(lo + block_rows, n)
        m = hi - lo
        res, book, cum = res_buf[:, :m], book_buf[:, :, :m], cum_buf[:, :, :m]
        for j, arr in enumerate((series.bid_sz, series.ask_sz, series.bid_ct, series.ask_ct)):
            book[j] = arr[lo:hi].T
        cum[:, 0] = book[:2, 0]  # float32 cumsum over the levels, bid and ask
        for i in range(1, N_LEVELS):
            np.add(cum[:, i - 1], book[:2, i], out=cum[:, i])
        depth = cum[0, -1] + cum[1, -1]
        counts = book[2, 0] + book[3, 0]
        for i in range(1, N_LEVELS):
            counts += book[2, i]
            counts += book[3, i]
        if counts.max(initial=0) >= _EXACT_F32_INT:  # order-dependent rounding: sum exactly as numpy does
            counts = series.bid_ct[lo:hi].sum(axis=1) + series.ask_ct[lo:hi].sum(axis=1)
        _ratio_into(res[imb : imb + N_LEVELS], cum[0] - cum[1], cum[0] + cum[1])
        share = res[shares : shares + 4 * N_LEVELS].reshape(4, N_LEVELS, m)
        _ratio_into(share[:2], book[:2], depth)
        _ratio_into(share[2:], book[2:], counts)
        np.log1p(depth, out=res[log_depth])  # elementwise, contiguous: as on the whole column
        for i, column in columns.items():
            res[i] = column[lo:hi]
        yield lo, res


def book_features(series: BookSeries, tick_size: float) -> Features:
    columns, mid2, dt = _book_columns(series, tick_size)
    values = np.empty((len(series.ts), len(BOOK_FEATURES)), dtype=np.float32)
    for lo, block in _book_blocks(series, columns):
        values[lo : lo + block.shape[1]] = block.T
    return Features(BOOK_FEATURES, values, series.ts, mid2, 2.0 * FIXED, dt.astype(np.float32))


def write_book_features(series: BookSeries, tick_size: float, path: str | Path) -> Features:
    """`book_features`, written block by block straight into the .npy file `path` (as `np.save` would
    write it); the returned values are a read-only memory map of that file.

    Each block is written while still in cache, and no [N, F] array is ever held in memory.
    """
    columns, mid2, dt = _book_columns(series, tick_size)
    shape = (len(series.ts), len(BOOK_FEATURES))
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False, "shape": shape}
    rows = np.empty((min(BOOK_BLOCK_ROWS, shape[0]), shape[1]), dtype=np.float32)
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        for _, block in _book_blocks(series, columns):
            m = block.shape[1]
            rows[:m] = block.T
            fh.write(rows[:m])
    values = np.load(path, mmap_mode="r")
    return Features(BOOK_FEATURES, values, series.ts, mid2, 2.0 * FIXED, dt.astype(np.float32))


def bar_features(series: BarSeries) -> Features:
    close = stitch(series.close, series.instrument_id)
    same_contract = np.r_[False, series.instrument_id[1:] == series.instrument_id[:-1]]
    log_close = np.log(series.close.astype(np.float64))
    log_return = np.where(same_contract, np.diff(log_close, prepend=log_close[:1]), 0.0)
    minutes = (series.ts - series.ts[0]) // 60_000_000_000
    gap = np.diff(minutes, prepend=minutes[:1] - 1) - 1  # minutes without a bar before this one

    local = pl.from_epoch(pl.Series(series.ts), time_unit="ns").dt.replace_time_zone("UTC")
    local = local.dt.convert_time_zone(SESSION_TZ)
    minute_of_day = (local.dt.hour().cast(pl.Int32) * 60 + local.dt.minute().cast(pl.Int32)).to_numpy()
    session_minute = (minute_of_day - 17 * 60) % 1440  # the session opens at 17:00 CT
    session_day = local.dt.offset_by("7h").dt.date().cast(pl.Int32).to_numpy()

    frame = pl.DataFrame(
        {"r": log_return, "logv": np.log1p(series.volume)},
    ).with_columns(
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
        np.log(series.high / series.low.astype(np.float64)),
        np.log(series.close / series.open.astype(np.float64)),
        frame["r5"].to_numpy(),
        frame["r15"].to_numpy(),
        frame["rv30"].to_numpy(),
        vz.to_numpy(),
        np.log1p(gap),
        np.sin(angle),
        np.cos(angle),
        ((minute_of_day >= 8 * 60 + 30) & (minute_of_day < 15 * 60)).astype(np.float64),
        session_minute / 1380.0,
        np.r_[True, session_day[1:] != session_day[:-1]].astype(np.float64),
    ]
    values = np.stack([np.asarray(c, dtype=np.float32) for c in columns], axis=1)
    dt = (np.diff(series.ts, prepend=series.ts[:1]) / 1e9).astype(np.float32)
    return Features(BAR_FEATURES, values, series.ts, close, FIXED, dt)
