"""Stream one DBN file into the compact front-month series that features are computed from.

MBP-10: per chunk, keep only the outright contracts of the product and only the rows features
need (book snapshots = records with F_LAST, and trades = action 'T'), as a few narrow columns
(~200 B per row instead of 368 B), so memory stays bounded by the kept rows, never the whole
decompressed file. OHLCV-1m: keep the product's outright bars. Then choose the front month per
session and drop everything else.
"""

from __future__ import annotations

import datetime as dt
import queue
import threading
from collections.abc import Iterator
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


BOOK_CHUNK_RECORDS = 8_192  # ~3 MB of MBP-10 per decoded chunk: decode and extraction stay in cache
PREFETCH_CHUNKS = 4  # decoded chunks the background decoder may run ahead of the extraction
LEVEL_ROWS_START = 1 << 18  # 40 MB of book levels: above glibc's largest mmap threshold, so grown by mremap
_PAIR_FIELDS = ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct")
_PAIR_DTYPE = np.dtype([("px", "<i8", 2), ("q", "<u4", 4)])  # DBN BidAskPair: bid/ask px, then sz, ct


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


class _RowBuffer:
    """Rows appended in place to one growing array, then compacted in place to the rows finally kept.

    The array is large enough to be memory-mapped by the allocator, so growing it (`ndarray.resize`,
    i.e. realloc -> mremap) moves no data, and the kept rows never need a second full-size array.
    """

    def __init__(self, row_shape: tuple[int, ...], dtype: type, capacity: int) -> None:
        self._buf = np.empty((capacity, *row_shape), dtype=dtype)
        self.n = 0

    def reserve(self, k: int) -> np.ndarray:
        """The next `k` rows, to be filled by the caller before the next `reserve` (which may move them)."""
        need = self.n + k
        if need > len(self._buf):
            grown = max(need, len(self._buf) + len(self._buf) // 2)
            self._buf.resize((grown, *self._buf.shape[1:]), refcheck=False)
        rows = self._buf[self.n : need]
        self.n = need
        return rows

    def take(self, mask: np.ndarray, block: int = 1 << 15) -> np.ndarray:
        """`rows[mask]` (mask over the `n` rows appended), compacted in place; the buffer is handed over."""
        buf, self._buf = self._buf, None
        dst = 0
        for lo in range(0, self.n, block):
            hi = min(lo + block, self.n)
            part = buf[lo:hi][mask[lo:hi]]  # a small copy, so overlapping source/destination is safe
            buf[dst : dst + len(part)] = part
            dst += len(part)
            del part
        buf.resize((dst, *buf.shape[1:]), refcheck=False)
        return buf


def _chunk_book(chunk: np.ndarray, id_array: np.ndarray, levels_out: _RowBuffer) -> dict[str, np.ndarray]:
    """The narrow columns of one record chunk's kept rows; the book of its snapshot rows goes to `levels_out`."""
    action = chunk["action"].view(np.uint8)
    last = (chunk["flags"] & F_LAST) != 0
    is_trade = action == ACTION_TRADE
    keep = np.isin(chunk["instrument_id"], id_array) & (last | is_trade)
    snap = keep & last  # only snapshot rows need the book levels
    # the level block of the snapshot rows, as [k, 10] BidAskPairs (one contiguous copy)
    off = _levels_offset(chunk.dtype)
    raw = chunk.view(np.uint8).reshape(len(chunk), chunk.dtype.itemsize)
    pairs = raw[:, off : off + N_LEVELS * _PAIR_DTYPE.itemsize][snap]
    k = len(pairs)
    # rows with any 8-byte word equal to UNDEF_PRICE (one contiguous pass): only they can have empty levels
    maybe_empty = np.flatnonzero((pairs.view(np.int64).reshape(k, -1) == UNDEF_PRICE).any(axis=1))
    pairs = pairs.view(_PAIR_DTYPE).reshape(k, N_LEVELS)
    sizes = pairs["q"].reshape(k, N_LEVELS, 2, 2).transpose(0, 2, 3, 1)  # [k, sz/ct, bid/ask, level]
    levels = levels_out.reserve(k).reshape(k, 2, 2, N_LEVELS)  # [k, 4, 10]: bid_sz, ask_sz, bid_ct, ask_ct
    np.copyto(levels, sizes, casting="unsafe")
    if len(maybe_empty):  # 0 where the level's price is undefined
        ok = pairs["px"][maybe_empty] != UNDEF_PRICE  # [r, 10, bid/ask]
        levels[maybe_empty] = sizes[maybe_empty] * ok.transpose(0, 2, 1)[:, None]
    side = chunk["side"].view(np.uint8)[keep]
    trade = is_trade[keep]
    size = chunk["size"][keep].astype(np.int64)
    signed = np.where(trade & (side == SIDE_BID), size, 0) - np.where(trade & (side == SIDE_ASK), size, 0)
    return {
        "ts": chunk["ts_recv"][keep].astype(np.int64),
        "iid": chunk["instrument_id"][keep],
        "last": last[keep],
        "signed": signed,
        "bpx": pairs["px"][:, 0, 0].copy(),
        "apx": pairs["px"][:, 0, 1].copy(),
    }


_QUARTER_HOUR_NS = 15 * 60 * 1_000_000_000


def _session_days(ts: np.ndarray) -> np.ndarray:
    """`session_days(ts)`, converting each run of one quarter hour once instead of every record.

    Time-zone offsets and DST switches are whole quarter hours, so a session (17:00 CT) never starts
    inside one: every timestamp of a quarter hour has the session day of the quarter hour's start.
    """
    quarter = ts // _QUARTER_HOUR_NS
    starts = np.flatnonzero(np.r_[True, quarter[1:] != quarter[:-1]])
    days = session_days(quarter[starts] * _QUARTER_HOUR_NS)
    return np.repeat(days, np.diff(np.r_[starts, len(ts)]))


def read_book(info: DbnFile, root: str) -> BookSeries:
    require_schema(info, MBP10)
    ids = _outrights(info, root)
    id_array = np.fromiter(ids, dtype=np.uint32)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("ts", "iid", "last", "signed", "bpx", "apx")}
    book = _RowBuffer((4, N_LEVELS), np.float32, LEVEL_ROWS_START)
    with _Prefetch(iter_records(info, BOOK_CHUNK_RECORDS)) as chunks:
        for chunk in chunks:
            for k, v in _chunk_book(chunk, id_array, book).items():
                cols[k].append(v)
            del chunk
    if not cols["ts"] or sum(len(t) for t in cols["ts"]) == 0:
        raise DataError(info.path, f"no {root} outright book records in the file")
    ts, iid = np.concatenate(cols.pop("ts")), np.concatenate(cols.pop("iid"))
    _check_monotonic(info, ts, "ts_recv")
    sessions = _session_days(ts)
    front = choose_front(sessions, iid, np.ones(len(ts), dtype=np.int64), ids, _ref_year(info))
    on_front = front.mask(sessions, iid)
    del sessions

    signed = np.concatenate(cols.pop("signed"))[on_front]
    last_all = np.concatenate(cols.pop("last"))
    last = last_all[on_front]
    ts, iid = ts[on_front], iid[on_front]
    # trade flow between consecutive snapshots (the snapshot's own trade included)
    buys, sells = np.cumsum(np.maximum(signed, 0)), np.cumsum(np.maximum(-signed, 0))
    snap = np.flatnonzero(last)
    buy_volume = np.diff(buys[snap], prepend=0).astype(np.float64)
    sell_volume = np.diff(sells[snap], prepend=0).astype(np.float64)
    del buys, sells, signed
    front_snaps = on_front[last_all]  # over the snapshot rows (what bpx/apx/lv hold): on the front month
    bid_px, ask_px = np.concatenate(cols.pop("bpx"))[front_snaps], np.concatenate(cols.pop("apx"))[front_snaps]
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
        ts, iid, bid_px, ask_px = ts[good], iid[good], bid_px[good], ask_px[good]
        front_snaps[np.flatnonzero(front_snaps)[~good]] = False
    levels = book.take(front_snaps)
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
