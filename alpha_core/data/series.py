"""Stream one DBN file, twice, into the front-month series that features are computed from.

Memory never depends on the size of the file: each pass holds one decoded chunk and a few counters.

- Pass 1 (`read_book` / `read_bars`) checks the time order and sums, per CME session and outright
  contract, the activity the front-month choice needs (book record count, bar volume) and the rows the
  sidecar will have. `choose_front` then picks the front month of every session.
- Pass 2 (`BookSource.chunks` / `BarSource.chunks`) decodes the file again and yields the front-month
  rows in order: book snapshots (records with F_LAST and a valid best bid and ask) with the trade flow
  since the previous snapshot and the time of the latest trade, or bars. What one chunk needs from the
  ones before (trade flow not yet assigned to a snapshot, the latest trade) is carried over.
"""

from __future__ import annotations

import datetime as dt
import functools
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import databento_dbn as dbn
import numpy as np

from alpha_core.data.dbn import MBP10, OHLCV_1M, DbnFile, iter_records, record_dtype, require_schema
from alpha_core.data.front_month import FrontMonth, choose_front
from alpha_core.data.validate import RecordChecks, RecordRange
from alpha_core.errors import DataError
from alpha_core.sessions import session_days

N_LEVELS = 10
UNDEF_PRICE = dbn.UNDEF_PRICE
F_LAST = dbn.F_LAST
ACTION_TRADE = ord("T")
SIDE_BID, SIDE_ASK = ord("B"), ord("A")
NO_TRADE = -1  # trade_ts before the file's first front-month trade

BOOK_CHUNK_RECORDS = 8_192  # ~3 MB of MBP-10 per decoded chunk: decode and extraction stay in cache
PREFETCH_CHUNKS = 4  # decoded chunks the background decoder may run ahead of the extraction
BAR_CHUNK_RECORDS = 1 << 16  # OHLCV-1m records per decoded chunk (3.5 MB)
BAR_BLOCK_ROWS = 1 << 18  # front-month bars per yielded block (half a year of minutes): see features.BarFeatures
_PAIR_FIELDS = ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct")
_PAIR_DTYPE = np.dtype([("px", "<i8", 2), ("q", "<u4", 4)])  # DBN BidAskPair: bid/ask px, then sz, ct


@dataclass
class BookChunk:
    """Consecutive front-month book snapshots."""

    ts: np.ndarray  # int64 ts_recv
    instrument_id: np.ndarray  # uint32
    bid_px: np.ndarray  # int64 fixed 1e-9, best bid
    ask_px: np.ndarray  # int64, best ask
    buy_volume: np.ndarray  # float64, aggressor-buy size since the previous snapshot (its own trade included)
    sell_volume: np.ndarray
    trade_ts: np.ndarray  # int64 ts_event of the latest front-month trade received so far, NO_TRADE before any
    pairs: np.ndarray  # [n, 10] the snapshots' DBN BidAskPair levels, as decoded

    @functools.cached_property
    def levels(self) -> np.ndarray:
        """float32 [4, 10, n]: bid size, ask size, bid count, ask count per level, 0 where the level is empty.

        Feature-major, as `features.BookFeatures` reads them (one contiguous row per level and field), and
        computed on first use: in the thread of the features, not in the one that decodes (`BookSource.chunks`).
        """
        return _levels(self.pairs)

    @property
    def bid_sz(self) -> np.ndarray:
        """[n, 10] (a view)."""
        return self.levels[0].T

    @property
    def ask_sz(self) -> np.ndarray:
        return self.levels[1].T

    @property
    def bid_ct(self) -> np.ndarray:
        return self.levels[2].T

    @property
    def ask_ct(self) -> np.ndarray:
        return self.levels[3].T


@dataclass
class BarChunk:
    """Consecutive front-month bars."""

    ts: np.ndarray  # int64 ts_event (start of the minute)
    instrument_id: np.ndarray  # uint32
    open: np.ndarray  # int64 fixed 1e-9
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray  # float64


def _ref_year(info: DbnFile) -> int:
    return dt.datetime.fromtimestamp(info.start / 1e9, tz=dt.UTC).year


def _outrights(info: DbnFile, root: str) -> dict[int, str]:
    ids = info.outright_ids(root)
    if not ids:
        raise DataError(info.path, f"metadata.mappings has no outright {root} contracts ({sorted(info.mappings)})")
    return ids


class _TimeOrder:
    """Checks that the kept records' timestamps never go backwards, across chunks."""

    def __init__(self, info: DbnFile, field_name: str) -> None:
        self.info, self.field_name = info, field_name
        self.seen = 0
        self.last: int | None = None

    def __call__(self, ts: np.ndarray) -> None:
        if len(ts) == 0:
            return
        full = ts if self.last is None else np.concatenate(([self.last], ts))
        back = np.flatnonzero(full[1:] < full[:-1])
        if len(back):
            k = int(back[0]) + 1
            i = self.seen + k - (0 if self.last is None else 1)
            raise DataError(
                self.info.path, f"{self.field_name} goes backwards at kept record {i}: {int(full[k - 1])} then {int(full[k])}"
            )
        self.seen += len(ts)
        self.last = int(ts[-1])


class _Activity:
    """Sums of per-row values for each (session, instrument) pair, accumulated over the file's chunks.

    The values are whole numbers (record counts, volumes), so the float64 sums are exact in any order.
    """

    def __init__(self, n_values: int) -> None:
        self._sums: dict[int, np.ndarray] = {}
        self._n = n_values

    def add(self, sessions: np.ndarray, instrument_ids: np.ndarray, values: np.ndarray) -> None:
        key = (sessions.astype(np.int64) << 32) | instrument_ids.astype(np.int64)
        pairs, inverse = np.unique(key, return_inverse=True)
        inverse = inverse.reshape(-1)
        sums = [np.bincount(inverse, weights=values[:, j], minlength=len(pairs)) for j in range(self._n)]
        for pair, row in zip(pairs.tolist(), np.stack(sums, axis=1), strict=True):
            known = self._sums.get(pair)
            self._sums[pair] = row if known is None else known + row

    def table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sessions, instrument ids, [pairs, n_values] sums), sorted by session then instrument."""
        keys = np.array(sorted(self._sums), dtype=np.int64)
        sums = np.array([self._sums[k] for k in keys.tolist()]).reshape(len(keys), self._n)
        return (keys >> 32).astype(np.int64), keys & 0xFFFFFFFF, sums


def _front_totals(
    activity: _Activity, symbols: dict[int, str], ref_year: int
) -> tuple[FrontMonth, np.ndarray, np.ndarray, np.ndarray]:
    """The front month from the first column of the sums; (front, on-front mask, instrument ids, sums) per pair."""
    sessions, iids, sums = activity.table()
    front = choose_front(sessions, iids, sums[:, 0], symbols, ref_year)
    return front, front.mask(sessions, iids), iids, sums


def _contract_rows(iids: np.ndarray, rows: np.ndarray) -> dict[int, int]:
    """instrument_id -> sidecar rows, in instrument_id order (as `np.unique` of the rows' ids gives them)."""
    out: dict[int, int] = {}
    for iid, n in zip(iids.tolist(), rows.tolist(), strict=True):
        if n:
            out[iid] = out.get(iid, 0) + int(n)
    return dict(sorted(out.items()))


class _Prefetch:
    """Run a chunk iterator in a background thread, up to `depth` chunks ahead of the consumer.

    Decoding the next chunks (zstd decompression, which releases the GIL) then overlaps the work on
    this one. Chunks and any exception arrive in order, the exception raised in the consumer; leaving
    the `with` block stops the thread and closes the iterator.
    """

    _END = object()

    def __init__(self, items: Iterator[np.ndarray], depth: int = PREFETCH_CHUNKS) -> None:
        self._items = items
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="dbn-prefetch", daemon=True)

    def __enter__(self) -> _Prefetch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            item, error = self._queue.get()
            if error is not None:
                raise error
            if item is self._END:
                return
            yield item

    def _put(self, entry: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for item in self._items:
                if not self._put((item, None)):
                    return
            self._put((self._END, None))
        except BaseException as exc:  # handed over to the consumer, raised there
            self._put((self._END, exc))
        finally:
            close = getattr(self._items, "close", None)
            if close is not None:
                close()


_QUARTER_HOUR_NS = 15 * 60 * 1_000_000_000


def _session_days(ts: np.ndarray) -> np.ndarray:
    """`session_days(ts)`, converting each run of one quarter hour once instead of every record.

    Time-zone offsets and DST switches are whole quarter hours, so a session (17:00 CT) never starts
    inside one: every timestamp of a quarter hour has the session day of the quarter hour's start.
    """
    if len(ts) == 0:
        return np.empty(0, dtype=np.int32)
    quarter = ts // _QUARTER_HOUR_NS
    starts = np.flatnonzero(np.r_[True, quarter[1:] != quarter[:-1]])
    days = session_days(quarter[starts] * _QUARTER_HOUR_NS)
    return np.repeat(days, np.diff(np.r_[starts, len(ts)]))


def _changed(info: DbnFile) -> DataError:
    return DataError(info.path, "the file changed while its sidecar was built (the two passes disagree)")


# --- MBP-10 ---------------------------------------------------------------------------------------------------
@functools.cache
def _levels_offset(dtype: np.dtype) -> int:
    """Byte offset of the 10 packed BidAskPair levels in an MBP-10 record (checked against the dtype)."""
    fields = dtype.fields
    base = fields["bid_px_00"][1]
    for i in range(N_LEVELS):
        for j, name in enumerate(_PAIR_FIELDS):
            want = base + i * _PAIR_DTYPE.itemsize + (0, 8, 16, 20, 24, 28)[j]
            if fields[f"{name}_{i:02d}"][1] != want:
                raise DataError(None, f"unexpected MBP-10 record layout: {name}_{i:02d} not at byte {want}")
    return base


def _book_rows(chunk: np.ndarray, id_array: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of the rows features need (the product's outright snapshots and trades), and their flags."""
    last = (chunk["flags"] & F_LAST) != 0
    is_trade = chunk["action"].view(np.uint8) == ACTION_TRADE
    kept = np.flatnonzero(np.isin(chunk["instrument_id"], id_array) & (last | is_trade))
    return kept, last[kept], is_trade[kept]


def _valid_top(bid_px: np.ndarray, ask_px: np.ndarray) -> np.ndarray:
    """Both sides of the book present and not crossed/locked: the snapshot has a mid."""
    return (bid_px != UNDEF_PRICE) & (ask_px != UNDEF_PRICE) & (ask_px > bid_px)


def _pairs(chunk: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[k, 10] BidAskPair levels of the records `rows`: one contiguous copy out of the decoded chunk."""
    off = _levels_offset(chunk.dtype)
    raw = chunk.view(np.uint8).reshape(len(chunk), chunk.dtype.itemsize)
    return raw[rows, off : off + N_LEVELS * _PAIR_DTYPE.itemsize].view(_PAIR_DTYPE)


def _levels(pairs: np.ndarray) -> np.ndarray:
    """float32 [4, 10, k] level sizes and counts (bid sz, ask sz, bid ct, ask ct) of [k, 10] BidAskPairs."""
    k = len(pairs)
    # rows with any 8-byte word equal to UNDEF_PRICE, the int64 maximum (one contiguous pass): only they can have
    # empty levels
    maybe_empty = np.flatnonzero(pairs.view(np.int64).reshape(k, -1).max(axis=1) == UNDEF_PRICE)
    sizes = pairs["q"].reshape(k, N_LEVELS, 2, 2).transpose(2, 3, 1, 0)  # [sz/ct, bid/ask, level, k]
    levels = np.empty((4, N_LEVELS, k), dtype=np.float32)
    np.copyto(levels.reshape(2, 2, N_LEVELS, k), sizes, casting="unsafe")
    if len(maybe_empty):  # 0 where the level's price is undefined
        ok = pairs["px"][maybe_empty] != UNDEF_PRICE  # [r, 10, bid/ask]
        levels.reshape(2, 2, N_LEVELS, k)[..., maybe_empty] = sizes[..., maybe_empty] * ok.transpose(2, 1, 0)[None]
    return levels


@dataclass
class BookSource:
    """An MBP-10 file after its first pass: front month, rows and drops known; `chunks()` streams the rows."""

    info: DbnFile
    ids: dict[int, str]  # outright instrument_id -> raw symbol
    front: FrontMonth
    rows: int
    contracts: dict[int, int]  # instrument_id -> rows
    dropped: dict[str, int]
    records: RecordRange  # every record of the file (what a fold plan orders files by)

    def chunks(self) -> Iterator[BookChunk]:
        """Pass 2: the front-month snapshots with a valid top of book, in order, one decoded chunk at a time.

        Trades go to the next such snapshot (its own trade included); trades after the last one are dropped.
        Decoding and extraction run in a background thread (`_Prefetch`), beside the features and writes that
        consume the chunks: on two cores each side has about half of the work.
        """
        with _Prefetch(self._extract()) as extracted:
            yield from extracted

    def _extract(self) -> Iterator[BookChunk]:
        id_array = np.fromiter(self.ids, dtype=np.uint32)
        pending_buy = pending_sell = 0  # trade flow since the last yielded snapshot
        last_trade = NO_TRADE
        n = 0
        for chunk in iter_records(self.info, BOOK_CHUNK_RECORDS):
            kept, last, is_trade = _book_rows(chunk, id_array)
            ts = chunk["ts_recv"][kept].astype(np.int64)
            on_front = self.front.mask(_session_days(ts), chunk["instrument_id"][kept])
            kept, last, is_trade, ts = kept[on_front], last[on_front], is_trade[on_front], ts[on_front]
            if len(kept) == 0:
                continue
            side = chunk["side"].view(np.uint8)[kept]
            size = chunk["size"][kept].astype(np.int64)
            buys = pending_buy + np.cumsum(np.where(is_trade & (side == SIDE_BID), size, 0))
            sells = pending_sell + np.cumsum(np.where(is_trade & (side == SIDE_ASK), size, 0))
            latest = np.maximum.accumulate(np.where(is_trade, np.arange(len(kept)), -1))
            trade_ts = np.where(latest >= 0, chunk["ts_event"][kept[latest]].astype(np.int64), last_trade)
            last_trade = int(trade_ts[-1])

            snap = np.flatnonzero(last)
            bid_px, ask_px = chunk["bid_px_00"][kept[snap]], chunk["ask_px_00"][kept[snap]]
            snap = snap[_valid_top(bid_px, ask_px)]
            if len(snap) == 0:
                pending_buy, pending_sell = int(buys[-1]), int(sells[-1])
                continue
            pending_buy, pending_sell = int(buys[-1] - buys[snap[-1]]), int(sells[-1] - sells[snap[-1]])
            rows = kept[snap]
            n += len(rows)
            if n > self.rows:
                raise _changed(self.info)
            yield BookChunk(
                ts=ts[snap],
                instrument_id=chunk["instrument_id"][rows],
                bid_px=chunk["bid_px_00"][rows].astype(np.int64),
                ask_px=chunk["ask_px_00"][rows].astype(np.int64),
                buy_volume=np.diff(buys[snap], prepend=0).astype(np.float64),
                sell_volume=np.diff(sells[snap], prepend=0).astype(np.float64),
                trade_ts=trade_ts[snap],
                pairs=_pairs(chunk, rows),
            )
        if n != self.rows:
            raise _changed(self.info)


def read_book(info: DbnFile, root: str) -> BookSource:
    """Pass 1 over an MBP-10 file: time order, the front month per session (by record count), the rows."""
    require_schema(info, MBP10)
    ids = _outrights(info, root)
    id_array = np.fromiter(ids, dtype=np.uint32)
    order = _TimeOrder(info, "ts_recv")
    activity = _Activity(3)  # kept records, snapshots, snapshots with a valid top of book
    checks = RecordChecks(info, record_dtype(info))
    with _Prefetch(iter_records(info, BOOK_CHUNK_RECORDS, checks=checks)) as decoded:
        for chunk in decoded:
            kept, last, _ = _book_rows(chunk, id_array)
            ts = chunk["ts_recv"][kept].astype(np.int64)
            order(ts)
            valid = last & _valid_top(chunk["bid_px_00"][kept], chunk["ask_px_00"][kept])
            activity.add(_session_days(ts), chunk["instrument_id"][kept], np.stack([np.ones(len(kept)), last, valid], 1))
    if order.seen == 0:
        raise DataError(info.path, f"no {root} outright book records in the file")
    front, on_front, iids, sums = _front_totals(activity, ids, _ref_year(info))
    snapshots, valid = sums[on_front, 1], sums[on_front, 2]
    rows = int(valid.sum())
    if rows == 0:
        raise DataError(info.path, "no book snapshot with a valid best bid and ask")
    dropped = {"snapshots_without_valid_top_of_book": int(snapshots.sum()) - rows}
    return BookSource(info, ids, front, rows, _contract_rows(iids[on_front], valid), dropped, checks.result())


# --- OHLCV-1m -------------------------------------------------------------------------------------------------
@dataclass
class BarSource:
    """An OHLCV-1m file after its first pass; `chunks()` streams the front-month bars."""

    info: DbnFile
    ids: dict[int, str]
    front: FrontMonth
    rows: int
    contracts: dict[int, int]
    dropped: dict[str, int]
    records: RecordRange

    def chunks(self) -> Iterator[BarChunk]:
        """Pass 2: the front-month bars in order, in blocks of up to BAR_BLOCK_ROWS bars (more for a last one)."""
        id_array = np.fromiter(self.ids, dtype=np.uint32)
        parts: list[np.ndarray] = []
        n_parts = n = 0
        for chunk in iter_records(self.info, BAR_CHUNK_RECORDS):
            bars = chunk[np.isin(chunk["instrument_id"], id_array)]
            bars = bars[self.front.mask(session_days(bars["ts_event"].astype(np.int64)), bars["instrument_id"])]
            bad = (bars["low"] > bars["high"]) | (bars["open"] == UNDEF_PRICE) | (bars["close"] == UNDEF_PRICE)
            if bad.any():
                i = n + n_parts + int(np.flatnonzero(bad)[0])
                raise DataError(self.info.path, f"bar {i} has low > high or an undefined open/close price")
            parts.append(bars)
            n_parts += len(bars)
            if n_parts >= BAR_BLOCK_ROWS:
                yield self._block(parts)
                n += n_parts
                parts, n_parts = [], 0
        if n_parts:
            yield self._block(parts)
            n += n_parts
        if n != self.rows:
            raise _changed(self.info)

    def _block(self, parts: list[np.ndarray]) -> BarChunk:
        bars = np.concatenate(parts)
        if len(bars) > self.rows:
            raise _changed(self.info)
        return BarChunk(
            ts=bars["ts_event"].astype(np.int64),
            instrument_id=bars["instrument_id"].copy(),
            open=bars["open"].astype(np.int64),
            high=bars["high"].astype(np.int64),
            low=bars["low"].astype(np.int64),
            close=bars["close"].astype(np.int64),
            volume=bars["volume"].astype(np.float64),
        )


def read_bars(info: DbnFile, root: str) -> BarSource:
    """Pass 1 over an OHLCV-1m file: time order, the front month per session (by volume), the rows."""
    require_schema(info, OHLCV_1M)
    ids = _outrights(info, root)
    id_array = np.fromiter(ids, dtype=np.uint32)
    order = _TimeOrder(info, "ts_event")
    activity = _Activity(2)  # volume, bars
    checks = RecordChecks(info, record_dtype(info))
    for chunk in iter_records(info, BAR_CHUNK_RECORDS, checks=checks):
        bars = chunk[np.isin(chunk["instrument_id"], id_array)]
        ts = bars["ts_event"].astype(np.int64)
        order(ts)
        activity.add(
            session_days(ts), bars["instrument_id"], np.stack([bars["volume"].astype(np.float64), np.ones(len(bars))], 1)
        )
    if order.seen == 0:
        raise DataError(info.path, f"no {root} outright bars in the file")
    front, on_front, iids, sums = _front_totals(activity, ids, _ref_year(info))
    rows = int(sums[on_front, 1].sum())
    dropped = {"bars_off_front_month": order.seen - rows}
    return BarSource(info, ids, front, rows, _contract_rows(iids[on_front], sums[on_front, 1]), dropped, checks.result())
