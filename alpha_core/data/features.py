"""Vectorised features of the front-month book and bar series (numpy/polars, no loop over rows).

Prices become ticks or log ratios so the features are stationary and comparable across products;
the price level itself is kept apart as the sidecar's reference price. Missing levels contribute
zero size, so an empty level never turns into a huge number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from alpha_core.data.front_month import SESSION_TZ, stitch
from alpha_core.data.series import N_LEVELS, BarSeries, BookSeries

FIXED = 1e9
FEATURE_VERSION = "1"  # bump whenever a feature or label changes: old sidecars become stale

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


def book_features(series: BookSeries, tick_size: float) -> Features:
    tick_fixed = tick_size * FIXED
    bid, ask = series.bid_px.astype(np.float64), series.ask_px.astype(np.float64)
    bsz0, asz0 = series.bid_sz[:, 0].astype(np.float64), series.ask_sz[:, 0].astype(np.float64)
    spread_ticks = (ask - bid) / tick_fixed
    micro_offset = _ratio((ask - bid) * (bsz0 - asz0), 2.0 * (bsz0 + asz0)) / tick_fixed  # microprice - mid

    mid2 = series.bid_px + series.ask_px  # 2 x mid, exact integer
    mid2 = stitch(mid2, series.instrument_id)
    mid_change = np.diff(mid2, prepend=mid2[:1]) / (2.0 * tick_fixed)

    cum_b, cum_a = np.cumsum(series.bid_sz, axis=1), np.cumsum(series.ask_sz, axis=1)
    imbalance = _ratio(cum_b - cum_a, cum_b + cum_a)
    depth = (cum_b[:, -1] + cum_a[:, -1])[:, None]
    counts = (series.bid_ct.sum(axis=1) + series.ask_ct.sum(axis=1))[:, None]

    buys, sells = series.buy_volume, series.sell_volume
    dt = np.diff(series.ts, prepend=series.ts[:1]).astype(np.float64) / 1e9

    columns = [
        spread_ticks[:, None],
        micro_offset[:, None],
        mid_change[:, None],
        imbalance,
        _ratio(series.bid_sz, np.broadcast_to(depth, series.bid_sz.shape).astype(np.float32)),
        _ratio(series.ask_sz, np.broadcast_to(depth, series.ask_sz.shape).astype(np.float32)),
        _ratio(series.bid_ct, np.broadcast_to(counts, series.bid_ct.shape).astype(np.float32)),
        _ratio(series.ask_ct, np.broadcast_to(counts, series.ask_ct.shape).astype(np.float32)),
        np.log1p(depth),
        _ratio(buys - sells, buys + sells)[:, None],
        np.log1p(buys + sells)[:, None],
        np.log1p(dt * 1e3)[:, None],
    ]
    values = np.concatenate([c.astype(np.float32, copy=False) for c in columns], axis=1)
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
