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

CHECKS_VERSION = "1"  # part of the sidecar key: a sidecar built before a check existed is rebuilt, so checked
EARLIEST_NS = int(dt.datetime(1990, 1, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000_000
FUTURE_SLACK_NS = 86_400 * 1_000_000_000  # "in the future" = later than now + 1 day
NS_PER_DAY = 86_400 * 1_000_000_000
MAPPING_SLACK_DAYS = 1  # mapping dates may be trading dates (a session opens the evening before, UTC)
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
      Outright futures must be > 0; spreads may be 0 or negative, but never UNDEF_PRICE.

    Speed: the checked fields sit in a few 8-byte words of a record. Each such word is copied once into a
    contiguous column, so every check after it streams through cache instead of touching one cache line
    per record and field (and runs vectorised); the offending record is looked for only on failure.
    """

    def __init__(self, info: DbnFile, dtype: np.dtype) -> None:
        self.path = info.path
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
        self.layout |= {f: (fields[f][1], fields[f][0]) for f in _CHECKED if f in fields}
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
        pos = self._ids(col, ts, t_min, t_max)
        self._prices(chunk, col, pos)
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
            raise self.fail(i, f"length is {length} words ({4 * length} bytes), but metadata.schema {self.schema} "
                               f"records are {self.length} words: the records are not {self.schema}")
        raise self.fail(i, f"rtype is {rtype} ({_rtype_name(rtype)}), but metadata.schema {self.schema} records "
                           f"have rtype {self.rtype}")

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
                    raise self.fail(i, f"instrument_id {int(iid[i])} ({self.id_raw[k]}) at {iso(int(ts[i]))} is "
                                       f"outside its metadata.mappings dates [{lo}, {hi})")
        return pos

    def _prices(self, chunk: np.ndarray, col: dict[str, np.ndarray], pos: np.ndarray | None) -> None:
        checks = []  # (price field, where it must be real: a test of the flagged records, what it is)
        if self.levels:
            checks += [(f"{side}_px_00", lambda idx, side=side: chunk[f"{side}_sz_00"][idx] > 0,
                        "at a level with size > 0") for side in ("bid", "ask")]
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
            shown = "undefined (UNDEF_PRICE)" if value == UNDEF_PRICE else \
                f"{_price(value)} ({'a zero price' if value == 0 else 'a negative price'})"
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
                    raise self.fail(i, f"{name} {_price(int(v[i]))} is outside [low {_price(int(lo[i]))}, "
                                       f"high {_price(int(h[i]))}]")

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
            raise DataError(info.path, f"metadata.dataset is {info.dataset!r}, but {prod.symbol} data comes from "
                                       f"{prod.dataset}")


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
            raise DataError(info.path, f"metadata maps no product alpha knows (symbols {list(info.symbols)}, "
                                       f"known: {', '.join(PRODUCTS)})")
        roots = {p.root for p in prods}
        if shared is not None and not shared & roots:
            raise DataError(directory, f"files of different products: {files[0].name} maps "
                                       f"{', '.join(sorted(shared))}, {info.name} maps {', '.join(sorted(roots))}")
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
                raise DataError(info.path, f"same content (sha256 {sha[:16]}...) as {seen[sha].path}: "
                                           "remove one of the two files")
            seen[sha] = info


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
                raise DataError(b.path, f"records overlap {a.path} in time ({b.schema}): "
                                        f"{iso(rb.first_ts)} .. {iso(min(ra.last_ts, rb.last_ts))} is in both files")


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
