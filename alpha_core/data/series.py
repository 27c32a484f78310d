"""Stream one DBN file into the compact front-month series that features are computed from.

MBP-10: per chunk, keep only the outright contracts of the product and only the rows features
need (book snapshots = records with F_LAST, and trades = action 'T'), as a few narrow columns
(~200 B per row instead of 368 B), so memory stays bounded by the kept rows, never the whole
decompressed file. OHLCV-1m: keep the product's outright bars. Then choose the front month per
session and drop everything else.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import databento_dbn as dbn
import numpy as np

from alpha_core.data.dbn import MBP10, OHLCV_1M, DbnFile, iter_records, require_schema
from alpha_core.data.front_month import FrontMonth, choose_front, session_days
from alpha_core.errors import DataError

N_LEVELS = 10
UNDEF_PRICE = dbn.UNDEF_PRICE
F_LAST = dbn.F_LAST
ACTION_TRADE = ord("T")
SIDE_BID, SIDE_ASK = ord("B"), ord("A")


@dataclass
class BookSeries:
    """Front-month book snapshots plus the trade flow since the previous snapshot."""

    ts: np.ndarray  # int64 ts_recv
    instrument_id: np.ndarray  # uint32
    bid_px: np.ndarray  # int64 fixed 1e-9, best bid
    ask_px: np.ndarray  # int64, best ask
    bid_sz: np.ndarray  # float32 [N, 10], 0 where the level is empty
    ask_sz: np.ndarray
    bid_ct: np.ndarray
    ask_ct: np.ndarray
    buy_volume: np.ndarray  # float64, aggressor-buy size since the previous snapshot
    sell_volume: np.ndarray
    front: FrontMonth
    dropped: dict[str, int] = field(default_factory=dict)


@dataclass
class BarSeries:
    ts: np.ndarray  # int64 ts_event (start of the minute)
    instrument_id: np.ndarray
    open: np.ndarray  # int64 fixed 1e-9
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray  # float64
    front: FrontMonth
    dropped: dict[str, int] = field(default_factory=dict)


def _ref_year(info: DbnFile) -> int:
    return dt.datetime.fromtimestamp(info.start / 1e9, tz=dt.UTC).year


def _outrights(info: DbnFile, root: str) -> dict[int, str]:
    ids = info.outright_ids(root)
    if not ids:
        raise DataError(info.path, f"metadata.mappings has no outright {root} contracts ({sorted(info.mappings)})")
    return ids


def _check_monotonic(info: DbnFile, ts: np.ndarray, field_name: str) -> None:
    back = np.flatnonzero(ts[1:] < ts[:-1])
    if len(back):
        i = int(back[0]) + 1
        raise DataError(
            info.path, f"{field_name} goes backwards at kept record {i}: {int(ts[i - 1])} then {int(ts[i])}"
        )


def read_book(info: DbnFile, root: str) -> BookSeries:
    require_schema(info, MBP10)
    ids = _outrights(info, root)
    id_array = np.fromiter(ids, dtype=np.uint32)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("ts", "iid", "last", "signed", "bpx", "apx", "lv")}
    for chunk in iter_records(info):
        action = chunk["action"].view(np.uint8)
        last = (chunk["flags"] & F_LAST) != 0
        keep = np.isin(chunk["instrument_id"], id_array) & (last | (action == ACTION_TRADE))
        c = chunk[keep]
        act = action[keep]
        side = c["side"].view(np.uint8)
        size = c["size"].astype(np.int64)
        signed = np.where(act == ACTION_TRADE, np.where(side == SIDE_BID, size, np.where(side == SIDE_ASK, -size, 0)), 0)
        levels = np.empty((len(c), 4, N_LEVELS), dtype=np.float32)
        for i in range(N_LEVELS):
            bid_ok = c[f"bid_px_{i:02d}"] != UNDEF_PRICE
            ask_ok = c[f"ask_px_{i:02d}"] != UNDEF_PRICE
            levels[:, 0, i] = np.where(bid_ok, c[f"bid_sz_{i:02d}"], 0)
            levels[:, 1, i] = np.where(ask_ok, c[f"ask_sz_{i:02d}"], 0)
            levels[:, 2, i] = np.where(bid_ok, c[f"bid_ct_{i:02d}"], 0)
            levels[:, 3, i] = np.where(ask_ok, c[f"ask_ct_{i:02d}"], 0)
        cols["ts"].append(c["ts_recv"].astype(np.int64))
        cols["iid"].append(c["instrument_id"].copy())
        cols["last"].append(last[keep])
        cols["signed"].append(signed)
        cols["bpx"].append(c["bid_px_00"].copy())
        cols["apx"].append(c["ask_px_00"].copy())
        cols["lv"].append(levels)
        del chunk, c
    if not cols["ts"] or sum(len(t) for t in cols["ts"]) == 0:
        raise DataError(info.path, f"no {root} outright book records in the file")
    ts, iid = np.concatenate(cols.pop("ts")), np.concatenate(cols.pop("iid"))
    _check_monotonic(info, ts, "ts_recv")
    sessions = session_days(ts)
    front = choose_front(sessions, iid, np.ones(len(ts), dtype=np.int64), ids, _ref_year(info))
    on_front = front.mask(sessions, iid)
    del sessions

    signed = np.concatenate(cols.pop("signed"))[on_front]
    last = np.concatenate(cols.pop("last"))[on_front]
    ts, iid = ts[on_front], iid[on_front]
    # trade flow between consecutive snapshots (the snapshot's own trade included)
    buys, sells = np.cumsum(np.maximum(signed, 0)), np.cumsum(np.maximum(-signed, 0))
    snap = np.flatnonzero(last)
    buy_volume = np.diff(buys[snap], prepend=0).astype(np.float64)
    sell_volume = np.diff(sells[snap], prepend=0).astype(np.float64)
    rows = np.flatnonzero(on_front)[snap]
    bid_px, ask_px = np.concatenate(cols.pop("bpx"))[rows], np.concatenate(cols.pop("apx"))[rows]
    levels = np.concatenate(cols.pop("lv"))[rows]
    ts, iid = ts[snap], iid[snap]

    # a snapshot without both sides of the book, or crossed/locked, has no mid: drop it
    good = (bid_px != UNDEF_PRICE) & (ask_px != UNDEF_PRICE) & (ask_px > bid_px)
    dropped = {"snapshots_without_valid_top_of_book": int((~good).sum())}
    if not good.any():
        raise DataError(info.path, "no book snapshot with a valid best bid and ask")
    if not good.all():  # keep the dropped snapshot's trades: move them to the next kept snapshot
        cum_b, cum_s = np.cumsum(buy_volume), np.cumsum(sell_volume)
        kept = np.flatnonzero(good)
        buy_volume = np.diff(cum_b[kept], prepend=0.0)
        sell_volume = np.diff(cum_s[kept], prepend=0.0)
        ts, iid, bid_px, ask_px, levels = ts[good], iid[good], bid_px[good], ask_px[good], levels[good]
    return BookSeries(
        ts=ts,
        instrument_id=iid,
        bid_px=bid_px.astype(np.int64),
        ask_px=ask_px.astype(np.int64),
        bid_sz=levels[:, 0],
        ask_sz=levels[:, 1],
        bid_ct=levels[:, 2],
        ask_ct=levels[:, 3],
        buy_volume=buy_volume,
        sell_volume=sell_volume,
        front=front,
        dropped=dropped,
    )


def read_bars(info: DbnFile, root: str) -> BarSeries:
    require_schema(info, OHLCV_1M)
    ids = _outrights(info, root)
    id_array = np.fromiter(ids, dtype=np.uint32)
    parts = [chunk[np.isin(chunk["instrument_id"], id_array)] for chunk in iter_records(info)]
    bars = np.concatenate(parts) if parts else np.empty(0)
    if len(bars) == 0:
        raise DataError(info.path, f"no {root} outright bars in the file")
    ts = bars["ts_event"].astype(np.int64)
    _check_monotonic(info, ts, "ts_event")
    iid = bars["instrument_id"]
    volume = bars["volume"].astype(np.float64)
    sessions = session_days(ts)
    front = choose_front(sessions, iid, volume, ids, _ref_year(info))
    on_front = front.mask(sessions, iid)
    bars = bars[on_front]
    bad = (bars["low"] > bars["high"]) | (bars["open"] == UNDEF_PRICE) | (bars["close"] == UNDEF_PRICE)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(info.path, f"bar {i} has low > high or an undefined open/close price")
    return BarSeries(
        ts=bars["ts_event"].astype(np.int64),
        instrument_id=bars["instrument_id"].copy(),
        open=bars["open"].astype(np.int64),
        high=bars["high"].astype(np.int64),
        low=bars["low"].astype(np.int64),
        close=bars["close"].astype(np.int64),
        volume=bars["volume"].astype(np.float64),
        front=front,
        dropped={"bars_off_front_month": int((~on_front).sum())},
    )
