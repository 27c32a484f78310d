"""Refuse hostile DBN data: per-record checks on every decoded chunk, and checks over a symbol's file set.

Every reader (inspect, sidecar builds, fold plans) gets its records from `dbn.iter_records`, which runs
`RecordChecks` on each chunk, so nothing downstream ever sees a record these checks refuse. The checks are
vectorised over the chunk and fail on the first bad record with one line naming the record and the field:
`x.dbn.zst: record 1234: bid_px_00 is 0 (a zero price)`.

Legal but suspicious data (wide spreads, long gaps, price jumps) is not refused here: `checks.py` reports it
as a failed integrity check instead.
"""

from __future__ import annotations

import datetime as dt
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import databento_dbn as dbn
import numpy as np

from alpha_core.data.products import PRODUCTS, Product, parse_contract
from alpha_core.errors import DataError
from alpha_core.hashing import file_sha256

if TYPE_CHECKING:
    from alpha_core.data.dbn import DbnFile

CHECKS_VERSION = "2"  # part of the sidecar key: a sidecar built before a check existed is rebuilt, so checked
EARLIEST_NS = int(dt.datetime(1990, 1, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000_000
FUTURE_SLACK_NS = 86_400 * 1_000_000_000  # "in the future" = later than now + 1 day
NS_PER_DAY = 86_400 * 1_000_000_000
MAPPING_SLACK_DAYS = 1  # mapping dates may be trading dates (a session opens the evening before, UTC)
FAR_NS = 366 * NS_PER_DAY  # an end file further than this (and than the other files span) from the rest: a stray
TINY_SHARE = 0.01  # a file under this share of the median file size of its schema (3 or more files): a stray
UNDEF_PRICE = dbn.UNDEF_PRICE
UNDEF_TIMESTAMP = dbn.UNDEF_TIMESTAMP
PRICE_SCALE = dbn.FIXED_PRICE_SCALE
_OHLCV_DEPRECATED = dbn.RType.OHLCV_DEPRECATED.value


def iso(ts_ns: int) -> str:
    if ts_ns == UNDEF_TIMESTAMP:
        return "undefined (UNDEF_TIMESTAMP)"
    seconds, ns = divmod(ts_ns, 1_000_000_000)
    try:
        when = dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return f"{ts_ns} ns"
    return f"{when}.{ns:09d}Z" if ns else f"{when}Z"


def display_path(path: Path) -> Path:
    """`path` with bytes that are not UTF-8 and control characters escaped (\\xff, \\n): always one printable line."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return Path("".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text))


def check_path(path: Path) -> None:
    """A readable name and a regular file: a pipe would block the reader, a surrogate name breaks JSON, and a
    newline in a name would split the one-line message."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(display_path(path), "file name is not valid UTF-8; rename the file") from None
    if not path.name.isprintable():
        raise DataError(display_path(path), "file name holds control characters (a newline, tab, ...); rename the file")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise DataError(path, "file does not exist (or is a broken link)") from None
    except OSError as exc:
        raise DataError(path, f"file cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise DataError(path, "not a regular file (a directory, pipe, socket or device has a DBN name)")


# --- per-record checks -----------------------------------------------------------------------------------


def _price(px: int) -> str:
    return f"{px / PRICE_SCALE:.9g}"


@dataclass
class RecordRange:
    """What a full checked pass over a file saw: record count and the first/last index timestamp."""

    count: int
    first_ts: int
    last_ts: int


_CHECKED = ("instrument_id", "ts_event", "ts_recv", "price", "bid_px_00", "ask_px_00", "open", "high", "low", "close")


class RecordChecks:
    """Checks each chunk of one file's records; call it on the chunks in file order.

    - header: every record's `length` and `rtype` match the metadata schema (records of another schema
      decode as garbage under the metadata's layout, and are caught at their first record);
    - time: the index timestamp (ts_recv, or ts_event where there is none) lies in the metadata's
      [start, end) and never goes backwards; no ts_event is before 1990 or later than now + 1 day;
    - symbology: every instrument_id is mapped by metadata.mappings on (about) the record's date;
    - prices that must exist are real: the best bid/ask where the level has size, trade prices, OHLC.
      Outright futures must be > 0; spreads may be 0 or negative, but never UNDEF_PRICE;
    - those prices fit the product: an outright of a product alpha knows lies in its plausible range
      (`products.Product.price_range`), and its best bid and ask on its tick grid (trades are not held to the
      grid: CME may price a spread's legs between ticks).

    `timestamps_only` keeps the checks a record's time range rests on (layout and time): what a fold plan reads.
    `observe_prices` (what `alpha inspect` runs) keeps every check but the product's range and tick grid, and
    records the outright price range and the records outside the product's plausible range instead
    (`price_warnings`): an inspection describes any valid DBN file; refusing data for a product is the sidecar
    build's job.

    Speed: the checked fields sit in a few 8-byte words of a record. Each such word is copied once into a
    contiguous column, so every check after it streams through cache instead of touching one cache line
    per record and field (and runs vectorised); the offending record is looked for only on failure.
    """

    def __init__(self, info: DbnFile, dtype: np.dtype, timestamps_only: bool = False, observe_prices: bool = False) -> None:
        self.path = info.path
        self.timestamps_only = timestamps_only
        self.observe_prices = observe_prices
        self.price_lo: int | None = None  # outright prices seen (fixed point), with observe_prices
        self.price_hi: int | None = None
        self.implausible: dict[tuple[str, str], list] = {}  # (raw symbol, why) -> [count, record, field, value, what]
        self.schema = info.schema
        self.itemsize = dtype.itemsize
        fields = dtype.fields or {}
        rtype = dbn.RType.from_schema(dbn.Schema(info.schema)).value
        rtypes = [rtype, _OHLCV_DEPRECATED] if info.schema.startswith("ohlcv") else [rtype]
        self.length, self.rtype = dtype.itemsize // 4, rtype
        self.headers = [self.length | r << 8 for r in rtypes]  # the first two bytes: length, rtype
        self.index_field = "ts_recv" if "ts_recv" in fields else "ts_event"
        self.event_field = "ts_event" if self.index_field != "ts_event" and "ts_event" in fields else None
        self.start, self.end = info.start, info.end
        self.future = time.time_ns() + FUTURE_SLACK_NS
        self.lo = max(self.start, EARLIEST_NS)
        self.hi = self.future if self.end is None else min(self.end, self.future)
        self.levels = "bid_px_00" in fields and "ask_sz_00" in fields  # sizes read only where a price is off
        self.trades = "price" in fields and "action" in fields
        self.ohlc = [f for f in ("open", "high", "low", "close") if f in fields]
        self.layout = {"header": (0, np.dtype("<u2"))}  # name -> (byte offset, dtype) of the columns checked
        checked = (self.index_field, self.event_field) if timestamps_only else _CHECKED
        self.layout |= {f: (fields[f][1], fields[f][0]) for f in checked if f in fields}
        self.words = dtype.itemsize % 8 == 0  # every checked field then lies inside one 8-byte word
        self._symbology(info)
        self.count = 0
        self.first_ts: int | None = None
        self.last_ts: int | None = None

    def _symbology(self, info: DbnFile) -> None:
        """Sorted known ids with their mapped day range and whether they are outright futures."""
        spans: dict[int, list] = {}
        for raw, intervals in info.mappings.items():
            outright = parse_contract(raw) is not None
            for iv in intervals:
                lo, hi = _day(iv.start_date), _day(iv.end_date)
                span = spans.setdefault(iv.instrument_id, [lo, hi, outright, raw])
                span[0], span[1] = min(span[0], lo), max(span[1], hi)
                span[2] = span[2] and outright
        ids = sorted(spans)
        self.mapped = bool(ids)
        self.ids = np.array(ids, dtype=np.uint64)
        self.id_lo = np.array([spans[i][0] - MAPPING_SLACK_DAYS for i in ids], dtype=np.int64)
        self.id_hi = np.array([spans[i][1] + MAPPING_SLACK_DAYS for i in ids], dtype=np.int64)
        self.id_outright = np.array([spans[i][2] for i in ids], dtype=bool)
        self.id_raw = [spans[i][3] for i in ids]
        # the plausible price range and tick (fixed point) of each id's product; open for spreads and unknown roots
        prods = [_product_of(spans[i][3]) if spans[i][2] else None for i in ids]
        self.id_product = prods
        self.id_px_lo = np.array([-UNDEF_PRICE if p is None else _fixed(p.price_range[0]) for p in prods], np.int64)
        self.id_px_hi = np.array([UNDEF_PRICE - 1 if p is None else _fixed(p.price_range[1]) for p in prods], np.int64)
        self.id_tick = np.array([1 if p is None else _fixed(p.tick_size) for p in prods], dtype=np.int64)
        self.ranged = any(p is not None for p in prods)

    def fail(self, i: int, message: str) -> DataError:
        return DataError(self.path, f"record {self.count + int(i)}: {message}")

    def __call__(self, chunk: np.ndarray) -> None:
        if len(chunk) == 0:
            return
        col = self._columns(chunk)
        self._header(col)
        ts = col[self.index_field]
        t_min, t_max = int(ts.min()), int(ts.max())
        self._time(col, ts, t_min, t_max)
        if not self.timestamps_only:
            pos = self._ids(col, ts, t_min, t_max)
            self._prices(chunk, col, pos)
            if self.observe_prices:
                self._observe_prices(chunk, col, pos)
            elif pos is not None and self.ranged:
                self._product_prices(chunk, col, pos)
        if self.first_ts is None:
            self.first_ts = int(ts[0])
        self.last_ts = int(ts[-1])
        self.count += len(chunk)

    def result(self) -> RecordRange:
        if self.first_ts is None:
            raise DataError(self.path, "file holds no records")
        return RecordRange(self.count, self.first_ts, self.last_ts)

    def _columns(self, chunk: np.ndarray) -> dict[str, np.ndarray]:
        """Each checked field as a contiguous array over the chunk (sub-word fields widened to uint64)."""
        n = len(chunk)
        if not self.words:  # a record size that is not whole words: read the fields in place
            raw = chunk.view(np.uint8).reshape(n, self.itemsize)
            return {name: raw[:, at : at + ftype.itemsize].view(ftype)[:, 0] for name, (at, ftype) in self.layout.items()}
        records = chunk.view(np.uint64).reshape(n, self.itemsize // 8)
        words = {w: records[:, w].copy() for w in sorted({at // 8 for at, _ in self.layout.values()})}
        col = {}
        for name, (at, ftype) in self.layout.items():
            word = words[at // 8]
            shift, bits = 8 * (at % 8), 8 * ftype.itemsize
            if bits == 64:
                col[name] = word.view(ftype)
            else:  # shift and mask whole words: contiguous and vectorised (a strided narrow view is neither)
                value = word >> np.uint64(shift) if shift else word
                col[name] = value if shift + bits == 64 else value & np.uint64((1 << bits) - 1)
        return col

    def _header(self, col: dict[str, np.ndarray]) -> None:
        header = col["header"]
        bad = header != self.headers[0]
        for other in self.headers[1:]:
            bad &= header != other
        if not bad.any():
            return
        i = int(np.argmax(bad))
        length, rtype = int(header[i]) & 0xFF, int(header[i]) >> 8
        if length != self.length:
            raise self.fail(
                i,
                f"length is {length} words ({4 * length} bytes), but metadata.schema {self.schema} "
                f"records are {self.length} words: the records are not {self.schema}",
            )
        raise self.fail(
            i, f"rtype is {rtype} ({_rtype_name(rtype)}), but metadata.schema {self.schema} records have rtype {self.rtype}"
        )

    def _time(self, col: dict[str, np.ndarray], ts: np.ndarray, t_min: int, t_max: int) -> None:
        f = self.index_field
        if t_min < self.lo or t_max >= self.hi:
            i = int(np.argmax((ts < self.lo) | (ts >= self.hi)))
            raise self.fail(i, f"{f} {self._why(int(ts[i]), self.start, self.end)}")
        if self.event_field is not None:
            event = col[self.event_field]
            if int(event.min()) < EARLIEST_NS or int(event.max()) >= self.future:
                i = int(np.argmax((event < EARLIEST_NS) | (event >= self.future)))
                raise self.fail(i, f"{self.event_field} {self._why(int(event[i]), None, None)}")
        if self.last_ts is not None and int(ts[0]) < self.last_ts:
            raise self.fail(0, f"{f} goes backwards: {iso(int(ts[0]))} after {iso(self.last_ts)}")
        back = ts[1:] < ts[:-1]
        if back.any():
            i = int(np.argmax(back)) + 1
            raise self.fail(i, f"{f} goes backwards: {iso(int(ts[i]))} after {iso(int(ts[i - 1]))}")

    def _why(self, t: int, start: int | None, end: int | None) -> str:
        if t == UNDEF_TIMESTAMP:
            return "is undefined (UNDEF_TIMESTAMP)"
        if t < EARLIEST_NS:
            return f"is {iso(t)}, before 1990"
        if t >= self.future:
            return f"is {iso(t)}, in the future"
        if start is not None and t < start:
            return f"is {iso(t)}, before metadata.start {iso(start)}"
        return f"is {iso(t)}, at or after metadata.end {iso(end)}"

    def _ids(self, col: dict[str, np.ndarray], ts: np.ndarray, t_min: int, t_max: int) -> np.ndarray | None:
        """Each record's index into the known ids (None when the file maps none); an unmapped id is an error."""
        if not self.mapped:  # e.g. stype_in=instrument_id: nothing to check against, no outright known
            return None
        iid = col["instrument_id"]
        pos = np.searchsorted(self.ids, iid)
        np.minimum(pos, len(self.ids) - 1, out=pos)
        known = self.ids[pos] == iid
        if not known.all():
            i = int(np.argmax(~known))
            raise self.fail(i, f"instrument_id {int(iid[i])} maps to no symbol in metadata.mappings")
        d0, d1 = t_min // NS_PER_DAY, t_max // NS_PER_DAY
        if (self.id_lo > d0).any() or (self.id_hi <= d1).any():  # some mapping does not cover this chunk's days
            present = np.flatnonzero(np.bincount(pos, minlength=len(self.ids)))
            if (self.id_lo[present] > d0).any() or (self.id_hi[present] <= d1).any():
                day = (ts // NS_PER_DAY).astype(np.int64)
                outside = (day < self.id_lo[pos]) | (day >= self.id_hi[pos])
                if outside.any():
                    i = int(np.argmax(outside))
                    k = int(pos[i])
                    lo = _date(int(self.id_lo[k]) + MAPPING_SLACK_DAYS)
                    hi = _date(int(self.id_hi[k]) - MAPPING_SLACK_DAYS)
                    raise self.fail(
                        i,
                        f"instrument_id {int(iid[i])} ({self.id_raw[k]}) at {iso(int(ts[i]))} is "
                        f"outside its metadata.mappings dates [{lo}, {hi})",
                    )
        return pos

    def _prices(self, chunk: np.ndarray, col: dict[str, np.ndarray], pos: np.ndarray | None) -> None:
        checks = []  # (price field, where it must be real: a test of the flagged records, what it is)
        if self.levels:
            checks += [
                (f"{side}_px_00", lambda idx, side=side: chunk[f"{side}_sz_00"][idx] > 0, "at a level with size > 0")
                for side in ("bid", "ask")
            ]
        if self.trades:
            checks.append(("price", lambda idx: chunk["action"][idx] == b"T", "for a trade"))
        checks += [(f, None, "for a bar") for f in self.ohlc]
        first = None  # (record, field, what) of the earliest bad price
        for name, where, what in checks:
            i = self._first_bad_price(col[name], where, pos)
            if i is not None and (first is None or i < first[0]):
                first = (i, name, what)
        if first is not None:
            i, name, what = first
            value = int(col[name][i])
            shown = (
                "undefined (UNDEF_PRICE)"
                if value == UNDEF_PRICE
                else f"{_price(value)} ({'a zero price' if value == 0 else 'a negative price'})"
            )
            raise self.fail(i, f"{name} is {shown} {what} of {self._raw(col, i)}")
        if len(self.ohlc) == 4:
            o, h, lo, c = (col[f] for f in ("open", "high", "low", "close"))
            bad = h < lo
            if bad.any():
                i = int(np.argmax(bad))
                raise self.fail(i, f"high {_price(int(h[i]))} is below low {_price(int(lo[i]))}")
            for name, v in (("open", o), ("close", c)):
                bad = (v < lo) | (v > h)
                if bad.any():
                    i = int(np.argmax(bad))
                    raise self.fail(
                        i, f"{name} {_price(int(v[i]))} is outside [low {_price(int(lo[i]))}, high {_price(int(h[i]))}]"
                    )

    def _product_prices(self, chunk: np.ndarray, col: dict[str, np.ndarray], pos: np.ndarray) -> None:
        """Outright prices inside their product's plausible range, the best bid and ask on its tick grid."""
        lo, hi = self.id_px_lo[pos], self.id_px_hi[pos]
        first = None  # (record, field, what, off the grid)
        checks = []
        if self.levels:
            checks += [
                (f"{side}_px_00", lambda idx, side=side: chunk[f"{side}_sz_00"][idx] > 0, "at a level with size > 0", True)
                for side in ("bid", "ask")
            ]
        if self.trades:
            checks.append(("price", lambda idx: chunk["action"][idx] == b"T", "for a trade", False))
        checks += [(f, None, "for a bar", False) for f in self.ohlc]
        tick = self.id_tick[pos] if self.levels else None
        for name, where, what, grid in checks:
            px = col[name]
            bad = ((px < lo) | (px > hi)) & (px != UNDEF_PRICE)
            if grid:
                bad |= (px % tick != 0) & (px != UNDEF_PRICE)
            if not bad.any():
                continue
            idx = np.flatnonzero(bad)
            if where is not None:
                idx = idx[where(idx)]
            if len(idx) and (first is None or idx[0] < first[0]):
                first = (int(idx[0]), name, what)
        if first is None:
            return
        i, name, what = first
        k = int(pos[i])
        prod, value = self.id_product[k], int(col[name][i])
        lo_px, hi_px = prod.price_range
        if lo_px * PRICE_SCALE <= value <= hi_px * PRICE_SCALE:
            raise self.fail(
                i,
                f"{name} is {_price(value)} {what} of {self.id_raw[k]}, not on the {prod.symbol} tick "
                f"grid ({prod.tick_size:g}): another product's prices, or other units?",
            )
        raise self.fail(
            i,
            f"{name} is {_price(value)} {what} of {self.id_raw[k]}, outside the plausible "
            f"{prod.symbol} range [{lo_px:g}, {hi_px:g}]: another product's prices, or other units?",
        )

    def _observe_prices(self, chunk: np.ndarray, col: dict[str, np.ndarray], pos: np.ndarray | None) -> None:
        """Widen the outright price range and count the records outside their product's range or tick grid."""
        fields = []
        if self.levels:
            fields += [
                (f"{side}_px_00", chunk[f"{side}_sz_00"] > 0, "at a level with size > 0", True) for side in ("bid", "ask")
            ]
        if self.trades:
            fields.append(("price", chunk["action"] == b"T", "for a trade", False))
        fields += [(f, None, "for a bar", False) for f in self.ohlc]
        for name, where, what, grid in fields:
            px = col[name].view(np.int64)
            real = px != UNDEF_PRICE
            if where is not None:
                real &= where
            if pos is not None:
                real &= self.id_outright[pos]
            if not real.any():
                continue
            seen = px[real]
            lo, hi = int(seen.min()), int(seen.max())
            self.price_lo = lo if self.price_lo is None else min(self.price_lo, lo)
            self.price_hi = hi if self.price_hi is None else max(self.price_hi, hi)
            if pos is None or not self.ranged:
                continue
            outside = real & ((px < self.id_px_lo[pos]) | (px > self.id_px_hi[pos]))
            off_grid = real & ~outside & (px % self.id_tick[pos] != 0) if grid else np.zeros(len(px), bool)
            for bad, why in ((outside, "range"), (off_grid, "grid")):
                idx = np.flatnonzero(bad)
                ids, first, counts = np.unique(pos[idx], return_index=True, return_counts=True)  # per contract
                for k, i, n in zip(ids.tolist(), idx[first].tolist(), counts.tolist(), strict=True):
                    entry = self.implausible.get((self.id_raw[k], why))
                    if entry is None:
                        self.implausible[(self.id_raw[k], why)] = [n, self.count + i, name, int(px[i]), what, k]
                    else:
                        entry[0] += n
                        if self.count + i < entry[1]:
                            entry[1:4] = [self.count + i, name, int(px[i])]
                            entry[4] = what

    def price_warnings(self) -> list[str]:
        """One line per contract whose prices do not fit its product (with observe_prices): the count and the first."""
        lines = []
        for (raw, why), (count, record, name, value, what, k) in sorted(self.implausible.items(), key=lambda e: e[1][1]):
            prod = self.id_product[k]
            if why == "range":
                lo, hi = prod.price_range
                fit = f"outside the plausible {prod.symbol} range [{lo:g}, {hi:g}]"
            else:
                fit = f"not on the {prod.symbol} tick grid ({prod.tick_size:g})"
            lines.append(
                f"{display_path(self.path)}: {count} price(s) of {raw} {fit}, first record {record}: {name} is "
                f"{_price(value)} {what} of {raw}: another product's prices, or other units? (predecode refuses this file)"
            )
        return lines

    def _first_bad_price(self, px: np.ndarray, where, pos: np.ndarray | None) -> int | None:
        """The first record whose price is <= 0 or UNDEF_PRICE (one unsigned compare) where it must be real.
        Spreads, and ids the metadata does not map, may be zero or negative: only UNDEF_PRICE is bad for them.
        Where a price must be real (a level with size, a trade) is only read for the few records flagged."""
        invalid = (px.view(np.uint64) - np.uint64(1)) >= np.uint64(UNDEF_PRICE - 1)
        if not invalid.any():
            return None
        idx = np.flatnonzero(invalid)
        if where is not None:
            idx = idx[where(idx)]
        keep = px[idx] == UNDEF_PRICE
        if pos is not None:
            keep |= self.id_outright[pos[idx]]
        idx = idx[keep]
        return int(idx[0]) if len(idx) else None

    def _raw(self, col: dict[str, np.ndarray], i: int) -> str:
        iid = int(col["instrument_id"][i])
        if not self.mapped:
            return f"instrument_id {iid}"
        return self.id_raw[int(np.searchsorted(self.ids, iid))]


_EPOCH = dt.date(1970, 1, 1).toordinal()


def _fixed(price: float) -> int:
    return int(round(price * PRICE_SCALE))


def _product_of(raw_symbol: str) -> Product | None:
    contract = parse_contract(raw_symbol)
    return next((p for p in PRODUCTS.values() if contract is not None and p.root == contract.root), None)


def _day(d: dt.date) -> int:
    return d.toordinal() - _EPOCH


def _date(day: int) -> dt.date:
    return dt.date.fromordinal(_EPOCH + day)


def _rtype_name(rtype: int) -> str:
    try:
        return str(dbn.RType(rtype))
    except ValueError:
        return "unknown"


# --- checks over a file set --------------------------------------------------------------------------------


def check_metadata(info: DbnFile) -> None:
    """What the metadata says must hold together: a time range, and the dataset of every product it maps."""
    if info.end is not None and info.end <= info.start:
        raise DataError(info.path, f"metadata.end {iso(info.end)} is not after metadata.start {iso(info.start)}")
    for prod in known_products(info):
        if info.dataset != prod.dataset:
            raise DataError(
                info.path, f"metadata.dataset is {info.dataset!r}, but {prod.symbol} data comes from {prod.dataset}"
            )


def known_products(info: DbnFile) -> list[Product]:
    return [p for p in PRODUCTS.values() if p.root in info.products()]


def check_products(directory: Path, files: list[DbnFile], symbol: Product | None) -> None:
    """Every file maps the symbol (or, without one, all files share a product alpha knows)."""
    shared: set[str] | None = None
    for info in files:
        prods = known_products(info)
        if symbol is not None:
            if symbol not in prods:
                found = ", ".join(p.symbol for p in prods) or "none alpha knows"
                raise DataError(info.path, f"metadata maps no {symbol.symbol} contracts (products found: {found})")
            continue
        if not prods:
            raise DataError(
                info.path, f"metadata maps no product alpha knows (symbols {list(info.symbols)}, known: {', '.join(PRODUCTS)})"
            )
        roots = {p.root for p in prods}
        if shared is not None and not shared & roots:
            raise DataError(
                directory,
                f"files of different products: {files[0].name} maps "
                f"{', '.join(sorted(shared))}, {info.name} maps {', '.join(sorted(roots))}",
            )
        shared = roots if shared is None else shared & roots


def check_duplicates(files: list[DbnFile]) -> None:
    """The same content twice would enter training twice (and share one sidecar). Only files of equal size
    are hashed, so a normal set costs no extra read."""
    by_size: dict[int, list[DbnFile]] = {}
    for info in files:
        by_size.setdefault(info.path.stat().st_size, []).append(info)
    seen: dict[str, DbnFile] = {}
    for group in by_size.values():
        if len(group) < 2:
            continue
        for info in group:
            sha = file_sha256(info.path)
            if sha in seen:
                raise DataError(
                    info.path, f"same content (sha256 {sha[:16]}...) as {seen[sha].path}: remove one of the two files"
                )
            seen[sha] = info


def check_strays(files: list[DbnFile]) -> None:
    """Refuse files that do not belong to the folder's series: a file whose metadata range lies far outside the
    range of the others (further from them than a year and than they span, e.g. a 2020 sample beside 2024
    quarters), or a file under 1% of the median size of its schema (a 4-record sample among quarters).

    An error, not a warning: the fold plan is chronological over files, so a stray file becomes a fold's
    training, validation or test file by itself (a test score over 4 rows, or a window trained across a
    three-year gap), and a warning in a step's log would not stop the plan, the models or the report built on
    it. It names the file and the fix (move it out of the folder), like the other checks over a file set.
    """
    by_schema: dict[str, list[DbnFile]] = {}
    for info in files:
        by_schema.setdefault(info.schema, []).append(info)
    for schema, group in by_schema.items():
        if len(group) < 2:
            continue
        ordered = sorted(group, key=lambda f: (f.start, str(f.path)))
        sizes = {f.path: f.path.stat().st_size for f in ordered}
        far = []
        for edge, rest in ((ordered[0], ordered[1:]), (ordered[-1], ordered[:-1])):
            lo = min(f.start for f in rest)
            hi = max(f.end if f.end is not None else f.start for f in rest)
            gap = lo - (edge.end if edge.end is not None else edge.start) if edge is ordered[0] else edge.start - hi
            if gap > max(FAR_NS, hi - lo):
                far.append((sizes[edge.path], edge, gap, lo, hi))
        if far:
            _, edge, gap, lo, hi = min(far, key=lambda x: (x[0], str(x[1].path)))
            side = "before" if edge is ordered[0] else "after"
            raise DataError(
                edge.path,
                f"metadata range starts {iso(edge.start)}, {gap / NS_PER_DAY:,.0f} days {side} "
                f"the folder's other {schema} files ({iso(lo)} .. {iso(hi)}): a file far "
                "outside the folder's range (a sample, or another period?); move it out of "
                "the folder",
            )
        if len(group) >= 3:
            median = float(np.median(list(sizes.values())))
            for f in ordered:
                if sizes[f.path] < TINY_SHARE * median:
                    raise DataError(
                        f.path,
                        f"file is {sizes[f.path]:,} bytes, under {100 * TINY_SHARE:.0f}% of the "
                        f"median {schema} file here ({median:,.0f} bytes): a sample or a stray "
                        "file among full ones?; move it out of the folder",
                    )


def check_overlaps(files: list[DbnFile], ranges: dict[Path, RecordRange]) -> None:
    """Two files of one schema whose record times overlap would put the same time in two folds."""
    by_schema: dict[str, list[DbnFile]] = {}
    for info in files:
        by_schema.setdefault(info.schema, []).append(info)
    for group in by_schema.values():
        ordered = sorted(group, key=lambda f: (ranges[f.path].first_ts, str(f.path)))
        for a, b in zip(ordered, ordered[1:], strict=False):
            ra, rb = ranges[a.path], ranges[b.path]
            if rb.first_ts <= ra.last_ts:
                raise DataError(
                    b.path,
                    f"records overlap {a.path} in time ({b.schema}): "
                    f"{iso(rb.first_ts)} .. {iso(min(ra.last_ts, rb.last_ts))} is in both files",
                )


def metadata_overlaps(files: list[DbnFile]) -> set[Path]:
    """Files whose metadata [start, end) meets another file's of the same schema: only these can have
    overlapping records (the record checks keep every record inside its file's metadata range)."""
    suspects: set[Path] = set()
    by_schema: dict[str, list[DbnFile]] = {}
    for info in files:
        by_schema.setdefault(info.schema, []).append(info)
    for group in by_schema.values():
        ordered = sorted(group, key=lambda f: f.start)
        reach, owner = None, None
        for info in ordered:
            if reach is not None and info.start < reach:
                suspects |= {info.path, owner.path}
            end = info.end if info.end is not None else UNDEF_TIMESTAMP
            if reach is None or end > reach:
                reach, owner = end, info
    return suspects
