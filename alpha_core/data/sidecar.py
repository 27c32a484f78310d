"""Predecoded sidecars: the feature-engineered form of one DBN file, built once, memory-mapped after.

A sidecar is a directory `{stem}.{ROOT}.{kind}.{key}/` holding one `.npy` per array and a
`meta.json`. The key hashes the source file's content, the feature version, the product and the
label settings, so a changed file, a new feature version or other labels never reuse an old
sidecar. It is written into a temporary directory and renamed into place in one step: readers see
a complete sidecar or none. On load the meta and every array's header and size are verified; a
corrupt sidecar is rebuilt, and older sidecars of the same file (stale keys) are removed. A build or repair
holds the sidecar's lock (`.{name}.lock`, `alpha_core.locks`): a second process wanting the same sidecar waits
and reuses it, and a builder frozen past the lock's staleness never touches the sidecar its successor wrote.

The source is opened once (`dbn.DbnSource`): its metadata, the hash that keys the sidecar and both build
passes read that one descriptor, and the build fails unless every pass decoded bytes of that hash, so a
file replaced or rewritten meanwhile never lands under another content's key. The meta records the source's
size, mtime, ctime, inode and device: while they are unchanged a sidecar is reused without hashing the
source again; when they change, the hash decides (and the record is brought up to date).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import os
import secrets
import shutil
import threading
import weakref
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import alpha_core
from alpha_core.atomic import atomic_directory, atomic_write_bytes, guard, remove_stale_temporaries, temporary_name
from alpha_core.bounds import MAX_FLOAT
from alpha_core.data.dbn import MBP10, OHLCV_1M, DbnFile, DbnSource, read_info, require_schema
from alpha_core.data.layout import ARRAYS, BARS, BOOK, STORED_DTYPES, Kind, column_sums
from alpha_core.data.products import Product, product
from alpha_core.data.validate import CHECKS_VERSION
from alpha_core.errors import DataError
from alpha_core.faults import crash_point
from alpha_core.locks import Lock

# bump whenever a feature, a label or the stored form changes: old sidecars become stale (4: the source's stat
# in meta.json, the key of the bytes the build decoded; 5: the source's record range in meta.json; 6: book features
# and labels stored as float16, and each feature's sums in meta.json)
FEATURE_VERSION = "6"
KIND_OF_SCHEMA = {MBP10: BOOK, OHLCV_1M: BARS}
DEFAULT_HORIZONS = {BOOK: (10, 100, 1000), BARS: (5, 15, 60)}
HORIZON_UNIT = {BOOK: "snapshots", BARS: "minutes"}

MAX_HORIZONS, MAX_HORIZON = 8, 1_000_000  # label horizons per sidecar; snapshots (book) or minutes (bars)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LabelConfig(Strict):
    """Label settings; `None` fields take the defaults of the kind and product. Bounded: a label array per horizon
    and a horizon of a week of minutes (or a million snapshots) at most."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    horizons: tuple[Annotated[int, Field(gt=0, le=MAX_HORIZON)], ...] | None = Field(
        default=None, min_length=1, max_length=MAX_HORIZONS
    )
    outcome_label_cost: float | None = Field(default=None, ge=0.0, le=MAX_FLOAT)

    def resolve(self, kind: str, prod: Product) -> tuple[tuple[int, ...], float]:
        horizons = self.horizons or DEFAULT_HORIZONS[kind]
        if any(h <= 0 for h in horizons) or list(horizons) != sorted(set(horizons)):
            raise DataError(None, f"horizons must be positive and increasing, got {list(horizons)}")
        cost = prod.default_cost if self.outcome_label_cost is None else self.outcome_label_cost
        return tuple(horizons), float(cost)


class ArraySpec(Strict):
    dtype: str
    shape: list[int]


class SourceInfo(Strict):
    name: str
    path: str
    sha256: str
    size: int
    # the file as stat saw it when its bytes were last hashed: unchanged, it needs no new hash to be reused
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int
    schema_: str = Field(alias="schema")
    dataset: str
    dbn_version: int
    metadata_symbols: list[str]


class RecordsInfo(Strict):
    """Every record of the source (not only the front month's rows): its count and index-time range, what a fold
    plan orders files by (`predecode.record_refs`)."""

    count: int
    first_ts: int
    last_ts: int


class FeatureSums(Strict):
    """Per feature, the sum and the sum of squares (float64) of its stored values over every row: what normalisation
    statistics need (`norm.fit_norm_stats`), so a fold's statistics cost O(files), not a pass over every row."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    total: list[float]
    total_sq: list[float]


class RollInfo(Strict):
    session: str
    from_contract: str
    to_contract: str


class SidecarMeta(Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    format: Literal["alpha-sidecar"] = "alpha-sidecar"
    feature_version: str
    key: str
    kind: Kind
    symbol: str
    tick_size: float
    source: SourceInfo
    records: RecordsInfo
    feature_names: list[str]
    feature_sums: FeatureSums
    horizons: list[int]
    horizon_unit: str
    outcome_label_cost: float
    price_note: str = "price: front-month mid (book) or close (bars), stitched at rolls"
    rows: int
    first_ts: int
    last_ts: int
    first_time: str
    last_time: str
    contracts: dict[str, int]
    roll_dates: list[RollInfo]
    dropped: dict[str, int]
    arrays: dict[str, ArraySpec]
    alpha_version: str


class SidecarCorrupt(Exception):
    """A sidecar directory that cannot be trusted (missing/invalid meta or array)."""


class Sidecar:
    """A sidecar: its verified meta, and its arrays as read-only memory maps opened when they are used.

    An array stays mapped while a caller holds it (or a view of it) and is unmapped when the last reference
    goes, so a list of sidecars holds no memory of its own: a step over many files does not keep every file it
    touched in its resident set. `read(name, start, stop)` copies rows without mapping anything (how the
    integrity checks stream). Arrays given to the constructor (e.g. a truncated copy) are used as they are.
    """

    def __init__(self, path: str | Path, meta: SidecarMeta, **arrays: np.ndarray) -> None:
        unknown = set(arrays) - set(ARRAYS)
        if unknown:
            raise TypeError(f"unknown sidecar arrays {sorted(unknown)}")
        self.path, self.meta = Path(path), meta
        self._given = arrays
        self._sums: tuple[np.ndarray, np.ndarray] | None = None  # given arrays' feature sums, when known
        self._mapped: dict[str, weakref.ref] = {}
        self._data_at: dict[str, int] = {}  # name -> byte offset of the first row in its `.npy` file

    def __repr__(self) -> str:
        return f"Sidecar({str(self.path)!r}, rows={self.meta.rows})"

    @property
    def rows(self) -> int:
        return self.meta.rows

    def array(self, name: str) -> np.ndarray:
        """The whole array `name`, memory-mapped read-only (the mapping of a holder, if one is alive)."""
        if name in self._given:
            return self._given[name]
        ref = self._mapped.get(name)
        arr = None if ref is None else ref()
        if arr is None:
            try:
                with _HEADER_LOCK:  # mapping is cheap: the header's parse is what the lock is for
                    arr = np.load(self.path / f"{name}.npy", mmap_mode="r")
            except FileNotFoundError:
                raise DataError(
                    self.path,
                    f"{name}.npy is gone: the sidecar was removed while in use (rebuilt by another run with other settings?)",
                ) from None
            self._mapped[name] = weakref.ref(arr)
        return arr

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of array `name` as an ordinary array, read from the file without mapping it."""
        if name in self._given:
            return np.array(self._given[name][start:stop])
        spec = self.meta.arrays[name]
        start, stop = max(start, 0), min(stop, spec.shape[0])
        dtype = np.dtype(spec.dtype)
        row = dtype.itemsize * int(np.prod(spec.shape[1:], dtype=np.int64))
        with open(self.path / f"{name}.npy", "rb") as fh:
            if name not in self._data_at:  # the header is parsed once (numpy parses it with `ast`)
                _npy_header(fh)
                self._data_at[name] = fh.tell()
            fh.seek(self._data_at[name] + start * row)
            out = np.fromfile(fh, dtype=dtype, count=max(stop - start, 0) * (row // dtype.itemsize))
        return out.reshape(-1, *spec.shape[1:])

    def feature_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """(sum, sum of squares) per feature over every row, float64: the build's, from the meta (given arrays: theirs)."""
        if self._sums is not None:
            return self._sums
        if "features" in self._given:
            return column_sums(self._given["features"])
        return np.array(self.meta.feature_sums.total), np.array(self.meta.feature_sums.total_sq)

    # the arrays, by name (see ARRAYS); each access returns the current mapping
    # dtypes as STORED_DTYPES says: a computation upcasts the book's float16 features and labels to float32
    features = property(lambda self: self.array("features"))  # [N, F] float16 (book) or float32 (bars)
    ts = property(lambda self: self.array("ts"))  # int64 [N] (ts_recv for the book, bar start for bars)
    price = property(lambda self: self.array("price"))  # float64 [N] stitched reference price
    dt = property(lambda self: self.array("dt"))  # float32 [N] seconds since the previous row
    # int64 [N] the close-trade clock: book, the ts_event of the latest front-month trade received at or
    # before this snapshot (file order; -1 before the first), so the snapshot a decision at a bar's close
    # trade may read is known; bars, the bar's upper bound ts + 60 s - 1 ns
    trade_ts = property(lambda self: self.array("trade_ts"))
    # [N, H] direction (1 up, 0 not up, NaN where `labels.py` says no price is known), float16 (book) or float32
    labels = property(lambda self: self.array("labels"))
    outcome_long = property(lambda self: self.array("outcome_long"))  # float32 [N, H] price units, net of cost
    outcome_short = property(lambda self: self.array("outcome_short"))
    instrument_id = property(lambda self: self.array("instrument_id"))  # uint32 [N]


SUM_ROWS = 1 << 20  # rows summed at a time (a float64 copy of this many rows at most)
LABEL_ARRAYS = ("labels", "outcome_long", "outcome_short")


def _with_rows(meta: SidecarMeta, rows: int, first_ts: int, last_ts: int, **update) -> SidecarMeta:
    arrays = {k: ArraySpec(dtype=v.dtype, shape=[rows, *v.shape[1:]]) for k, v in meta.arrays.items()}
    return meta.model_copy(
        update={
            "rows": rows,
            "first_ts": first_ts,
            "last_ts": last_ts,
            "first_time": _iso(first_ts),
            "last_time": _iso(last_ts),
            "arrays": arrays,
            **update,
        }
    )


def rows_between(sc: Sidecar, start: int, end: int) -> Sidecar:
    """The rows of `sc` whose ts lies in [start, end] (one calendar quarter of a file that spans several), as a
    sidecar of their own: the arrays are views of the file's, but the labels whose horizon runs past the last row
    are NaN (copied: only the label arrays), as at a file's end, so no label of one quarter reads the next."""
    ts = np.asarray(sc.ts)
    a, b = int(np.searchsorted(ts, start, side="left")), int(np.searchsorted(ts, end, side="right"))
    if (a, b) == (0, sc.rows):
        return sc
    if a >= b:
        raise DataError(sc.path, f"no rows between {_iso(start)} and {_iso(end)}")
    # plain views (np.asarray): a slice of a memmap keeps its file's offset, which `loader.take_rows` would read from
    arrays = {name: np.asarray(sc.array(name)[a:b]) for name in ARRAYS}
    part_ts = ts[a:b]
    for name in LABEL_ARRAYS:
        cut = np.array(arrays[name])
        for j, h in enumerate(sc.meta.horizons):
            if sc.meta.horizon_unit == "snapshots":
                first_past = max(len(part_ts) - h, 0)
            else:  # the last bar at or before ts + h minutes must be in the part: ts + h <= its last ts
                first_past = int(np.searchsorted(part_ts, int(part_ts[-1]) - h * 60_000_000_000, side="right"))
            cut[first_past:, j] = np.nan
        arrays[name] = cut
    out = Sidecar(sc.path, _with_rows(sc.meta, b - a, int(part_ts[0]), int(part_ts[-1])), **arrays)
    out._sums = _chunked_sums(arrays["features"])
    return out


def _chunked_sums(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    total, total_sq = np.zeros(values.shape[1]), np.zeros(values.shape[1])
    for a in range(0, len(values), SUM_ROWS):
        s, sq = column_sums(values[a : a + SUM_ROWS])
        total += s
        total_sq += sq
    return total, total_sq


class PartsSidecar(Sidecar):
    """A calendar quarter held by several sidecars (a daily or monthly split), read as one without copying them:
    `read` and `take` (what evaluation reads a book through: `loader.take_rows`) go to the parts, and only a whole
    array asked for (`array`, the bars') is concatenated, once. Each part's price is stitched on its own, so every
    later part is shifted to start at the price the previous one ended at: a part boundary adds no move (a roll or
    a stitch offset between files is never scored as a trade's profit)."""

    def __init__(self, parts: list[Sidecar], meta: SidecarMeta) -> None:
        super().__init__(parts[0].path, meta)
        self.parts = parts
        self.starts = np.cumsum([0] + [p.rows for p in parts])  # first row of each part, then the total
        shifts, level = [0.0], None
        for k, p in enumerate(parts):
            first, last = float(p.read("price", 0, 1)[0]), float(p.read("price", p.rows - 1, p.rows)[0])
            if k:
                shifts.append(level - first)
            level = last + shifts[k]
        self.shifts = shifts
        self._whole: dict[str, np.ndarray] = {}
        sums = [p.feature_sums() for p in parts]
        self._sums = (sum(x[0] for x in sums), sum(x[1] for x in sums))

    def _shifted(self, name: str, k: int, rows: np.ndarray) -> np.ndarray:
        return rows + self.shifts[k] if name == "price" and self.shifts[k] else rows

    def array(self, name: str) -> np.ndarray:
        if name not in self._whole:
            self._whole[name] = np.concatenate(
                [self._shifted(name, k, np.asarray(p.array(name))) for k, p in enumerate(self.parts)]
            )
        return self._whole[name]

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        start, stop = max(start, 0), min(stop, self.rows)
        out = []
        for k, p in enumerate(self.parts):
            a, b = max(start - int(self.starts[k]), 0), min(stop - int(self.starts[k]), p.rows)
            if a < b:
                out.append(self._shifted(name, k, p.read(name, a, b)))
        spec = self.meta.arrays[name]
        return np.concatenate(out) if out else np.empty((0, *spec.shape[1:]), np.dtype(spec.dtype))

    def take(self, name: str, rows: np.ndarray) -> np.ndarray:
        """`self.<name>[rows]` for sorted rows, gathered part by part (`take_rows` of each)."""
        rows = np.asarray(rows, dtype=np.int64)
        cuts = np.searchsorted(rows, self.starts)
        out = [
            self._shifted(name, k, take_rows(p, name, rows[cuts[k] : cuts[k + 1]] - int(self.starts[k])))
            for k, p in enumerate(self.parts)
        ]
        return np.concatenate(out)


def take_rows(sc: Sidecar, name: str, rows: np.ndarray) -> np.ndarray:
    """`sc.<name>[rows]` for sorted rows, read with one `pread` per run of consecutive rows: a gather from a huge
    file holds nothing but its result, and reads only its rows (a page fault in a memory map would read a whole
    read-ahead window around each row, 8 MiB on a typical block device, and leave the pages mapped). Arrays given
    to the Sidecar (in memory) are indexed."""
    rows = np.asarray(rows, dtype=np.int64)
    if hasattr(sc, "take"):  # a quarter of several files (`PartsSidecar`): gathered part by part
        return sc.take(name, rows)
    arr = sc.array(name)
    if not isinstance(arr, np.memmap) or not len(rows):
        return np.asarray(arr[rows])
    out = np.empty((len(rows), *arr.shape[1:]), dtype=arr.dtype)
    path, offset, row = arr.filename, arr.offset, arr.strides[0]
    del arr  # unmapped: nothing was touched through it
    cut = np.flatnonzero(np.diff(rows) != 1) + 1
    starts, ends = np.r_[0, cut], np.r_[cut, len(rows)]
    view = memoryview(out.reshape(len(rows), -1).view(np.uint8))
    fd = os.open(path, os.O_RDONLY)
    try:
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            buf, at, done = view[a:b].cast("B"), offset + int(rows[a]) * row, 0
            while done < len(buf):  # a short read continues where it stopped
                got = os.preadv(fd, [buf[done:]], at + done)
                if got == 0:
                    raise DataError(sc.path, f"{name}.npy ends before row {int(rows[b - 1])}")
                done += got
    finally:
        os.close(fd)
    return out


def concat_sidecars(parts: list[Sidecar], name: str) -> Sidecar:
    """One sidecar of a calendar quarter's parts, in time order, named for the quarter (`meta.source.name`), for
    evaluation: one part as it is, several as a `PartsSidecar` (nothing copied until a whole array is asked for)."""
    if len(parts) == 1:  # the same arrays (mapped as they are used), named for the quarter
        sc = parts[0]
        out = Sidecar(sc.path, sc.meta.model_copy(update={"source": sc.meta.source.model_copy(update={"name": name})}))
        out._given, out._sums = sc._given, sc._sums
        return out
    first = parts[0].meta
    contracts: dict[str, int] = {}
    for p in parts:
        for c, n in p.meta.contracts.items():
            contracts[c] = contracts.get(c, 0) + n
    meta = _with_rows(
        first,
        sum(p.rows for p in parts),
        first.first_ts,
        parts[-1].meta.last_ts,
        source=first.source.model_copy(update={"name": name}),
        contracts=contracts,
        roll_dates=[r for p in parts for r in p.meta.roll_dates],
    )
    return PartsSidecar(parts, meta)


def resolve_product(info: DbnFile, symbol: str | None) -> Product:
    """The product to extract: the given symbol, else the single product the file's metadata maps."""
    roots = info.products()
    if symbol is not None:
        prod = product(symbol)
        if prod.root not in roots:
            found = ", ".join(sorted(roots)) or "none"
            raise DataError(info.path, f"metadata maps no {prod.symbol} contracts (products found: {found})")
        return prod
    if len(roots) != 1:
        found = ", ".join(sorted(roots)) or "none"
        raise DataError(info.path, f"metadata maps several or no products ({found}); pass a symbol")
    return product(next(iter(roots)))


def sidecar_key(sha256: str, kind: str, prod: Product, horizons: tuple[int, ...], cost: float) -> str:
    """Content hash, never the file name: two different files named alike keep their own sidecars."""
    ident = json.dumps([sha256, kind, prod.symbol, FEATURE_VERSION, CHECKS_VERSION, list(horizons), cost])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".dbn.zst", ".dbn"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def ensure_sidecar(
    dbn_path: str | Path,
    predecoded_dir: str | Path,
    symbol: str | None = None,
    label_config: LabelConfig | None = None,
) -> tuple[Sidecar, str]:
    """Return the sidecar of `dbn_path`, building it on a miss. Status: built | reused | rebuilt.

    The directory is `{stem}.{ROOT}.{kind}.{key}`: the stem keeps it readable, the key (content hash)
    decides reuse. A sidecar whose meta names this file with its current stat is reused without hashing;
    otherwise the file is hashed through the descriptor the build reads. An older key is evicted only when its
    meta names this same file path, so two files of one name in different folders never evict each other.
    Failures to write the cache are one DataError naming the cache directory.
    """
    predecoded_dir = Path(predecoded_dir)
    with DbnSource(dbn_path, digests=True) as source:
        info = read_info(source)
        require_schema(info)
        kind = KIND_OF_SCHEMA[info.schema]
        prod = resolve_product(info, symbol)
        horizons, cost = (label_config or LabelConfig()).resolve(kind, prod)
        if predecoded_dir.exists() and not predecoded_dir.is_dir():
            raise DataError(predecoded_dir, "the sidecar cache is not a directory (a file is in the way)")
        prefix = f"{_stem(info.path)}.{prod.root}.{kind}."
        try:
            predecoded_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(predecoded_dir)
            unchanged = _unchanged(predecoded_dir, prefix, source, kind, prod, horizons, cost)
            if unchanged is not None:
                return unchanged, "reused"
            sha = source.sha256()
            key = sidecar_key(sha, kind, prod, horizons, cost)
            final = predecoded_dir / f"{prefix}{key}"
            if final.exists():
                try:
                    sc = load_sidecar(final, expect_key=key)
                    _restat(sc, source)
                    return sc, "reused"
                except SidecarCorrupt:
                    pass
            status = _build_locked(final, lambda tmp: _write(tmp, info, kind, prod, horizons, cost, sha, key), key)
            if status == "reused":
                return load_sidecar(final, expect_key=key), status
        except OSError as exc:
            raise DataError(predecoded_dir, f"cannot write the sidecar of {info.name}: {_os_reason(exc)}") from exc
    if _evict_older_keys(final, info.path):
        status = "rebuilt"
    return load_sidecar(final, expect_key=key), status


def _build_locked(final: Path, write, key: str) -> str:
    """Build (or repair) the sidecar `final` holding its lock: one builder at a time, the others wait for it and
    then reuse its sidecar ("reused"). A corrupt one is moved aside and rebuilt ("rebuilt"). Every commit checks
    the lock's fence, so a builder frozen past the lock's staleness, whose sidecar another builder has since
    written, stops (`LockLost`) without touching it."""
    lock = Lock(final.with_name(f".{final.name}.lock"), run=secrets.token_hex(6), step=str(final))
    lock.wait_acquire()
    with lock.hold(), guard(final, lock.check):
        crash_point("sidecar.locked")
        lock.check()  # a builder frozen here past the staleness stops, whatever its successor did
        status = "built"
        if final.exists():
            try:
                load_sidecar(final, expect_key=key)
                return "reused"  # built or repaired by the writer this one waited for
            except SidecarCorrupt:
                lock.check()
                aside = temporary_name(final)
                os.rename(final, aside)  # out of readers' sight in one step, then removed
                shutil.rmtree(aside, ignore_errors=True)
                status = "rebuilt"
        with atomic_directory(final) as tmp:
            write(tmp)
    return status


def _source_stat(source: DbnSource) -> dict[str, int]:
    st = source.stat
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino, "device": st.st_dev}


def _unchanged(
    cache: Path, prefix: str, source: DbnSource, kind: str, prod: Product, horizons: tuple[int, ...], cost: float
) -> Sidecar | None:
    """The sidecar of these settings whose meta names this file with its current stat (size, mtime and ctime,
    inode, device), verified like any load; None when there is none (then the content hash decides). ctime is
    part of it because a writer can set mtime back (`touch -r`, `cp -p`) but not ctime."""
    path, now = str(source.path.resolve()), _source_stat(source)
    for candidate in cache.iterdir():
        if not candidate.name.startswith(prefix):
            continue
        try:
            meta = SidecarMeta.model_validate_json((candidate / "meta.json").read_text())
        except (OSError, ValidationError, ValueError):
            continue
        src = meta.source
        if src.path != path or {k: getattr(src, k) for k in now} != now:
            continue
        key = sidecar_key(src.sha256, kind, prod, horizons, cost)
        if meta.key != key or candidate.name != prefix + key:
            continue
        try:
            return load_sidecar(candidate, expect_key=key)
        except SidecarCorrupt:
            return None
    return None


def unchanged_record_ranges(cache: str | Path) -> dict[str, RecordsInfo]:
    """Source path -> its records' range, from the sidecars in `cache` (and one level of symbol folders below
    it) whose source's stat is still the one recorded: what a fold plan needs, without decoding the file."""
    found: dict[str, RecordsInfo] = {}
    for meta_path in [*Path(cache).glob("*/meta.json"), *Path(cache).glob("*/*/meta.json")]:
        try:
            meta = SidecarMeta.model_validate_json(meta_path.read_text())
            st = os.stat(meta.source.path)
        except (OSError, ValidationError, ValueError):
            continue
        now = {
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino,
            "device": st.st_dev,
        }
        if meta.feature_version == FEATURE_VERSION and {k: getattr(meta.source, k) for k in now} == now:
            found[meta.source.path] = meta.records
    return found


def _restat(sc: Sidecar, source: DbnSource) -> None:
    """Record the source's current stat in a reused sidecar's meta (its content hash was just confirmed), so the
    next run reuses it without hashing. Best effort: a read-only cache keeps the old record."""
    source_info = sc.meta.source.model_copy(update={"path": str(source.path.resolve()), **_source_stat(source)})
    if source_info == sc.meta.source:
        return
    sc.meta = sc.meta.model_copy(update={"source": source_info})
    with contextlib.suppress(OSError):
        atomic_write_bytes(sc.path / "meta.json", _meta_json(sc.meta))


def _meta_json(meta: SidecarMeta) -> bytes:
    return (meta.model_dump_json(indent=2, by_alias=True) + "\n").encode()


def _evict_older_keys(final: Path, source: Path) -> bool:
    """Remove sidecars of the same name whose meta says they were built from `source` (an older content)."""
    prefix = final.name.rpartition(".")[0] + "."
    evicted = False
    for other in final.parent.iterdir():
        if other == final or not other.name.startswith(prefix) or not other.is_dir():
            continue
        try:
            meta = json.loads((other / "meta.json").read_text())
            built_from = meta["source"]["path"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not provably ours: another file's, or a half-read one
        if built_from == str(source.resolve()):
            shutil.rmtree(other, ignore_errors=True)
            evicted = True
    return evicted


def _os_reason(exc: OSError) -> str:
    """`no space left on device` where that is the cause (numpy reports a full disk as a short write)."""
    if exc.errno == errno.ENOSPC or "requested and" in str(exc):
        return f"no space left on device ({exc})"
    return (exc.strerror or str(exc)).lower() + (f": {exc.filename}" if exc.filename else "")


def _write(
    out: Path, info: DbnFile, kind: str, prod: Product, horizons: tuple[int, ...], cost: float, sha: str, key: str
) -> None:
    # the build stack (polars, the decoder) is imported here only: reading a sidecar needs numpy alone
    from alpha_core.data.build import build_arrays

    info.source.digests.clear()
    built = build_arrays(out, info, kind, prod, horizons, cost)
    if not info.source.digests or set(info.source.digests) != {sha}:
        raise DataError(
            info.path,
            f"the file changed while its sidecar was built (the bytes decoded do not hash to its sha256 {sha[:16]}...)",
        )
    symbols = info.outright_ids(prod.root)
    meta = SidecarMeta(
        feature_version=FEATURE_VERSION,
        key=key,
        kind=kind,
        symbol=prod.symbol,
        tick_size=prod.tick_size,
        source=SourceInfo(
            name=info.name,
            path=str(info.path.resolve()),
            sha256=sha,
            **_source_stat(info.source),
            schema=info.schema,
            dataset=info.dataset,
            dbn_version=info.version,
            metadata_symbols=list(info.symbols),
        ),
        records=RecordsInfo(count=built.records.count, first_ts=built.records.first_ts, last_ts=built.records.last_ts),
        feature_names=list(built.feature_names),
        feature_sums=FeatureSums(total=built.feature_sum, total_sq=built.feature_sum_sq),
        horizons=list(horizons),
        horizon_unit=HORIZON_UNIT[kind],
        outcome_label_cost=cost,
        rows=built.rows,
        first_ts=built.first_ts,
        last_ts=built.last_ts,
        first_time=_iso(built.first_ts),
        last_time=_iso(built.last_ts),
        contracts={symbols[i]: c for i, c in built.contracts.items()},
        roll_dates=[RollInfo(session=r.session, from_contract=r.from_contract, to_contract=r.to_contract) for r in built.rolls],
        dropped=built.dropped,
        arrays={name: ArraySpec(dtype=dtype, shape=shape) for name, (dtype, shape) in built.arrays.items()},
        alpha_version=alpha_core.__version__,
    )
    (out / "meta.json").write_bytes(_meta_json(meta))


# numpy parses a .npy header with `ast.literal_eval`, and CPython 3.11's conversion of a parse to AST objects is not
# safe in two threads at once ("SystemError: AST constructor recursion depth mismatch", CPython gh-106905): hyperopt's
# particles train on threads and read sidecars together, so every header read here is parsed under one lock.
_HEADER_LOCK = threading.Lock()


def _iso(ts_ns: int) -> str:
    return dt.datetime.fromtimestamp(ts_ns / 1e9, tz=dt.UTC).isoformat()


def _npy_header(fh) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of an open `.npy` file, leaving it at the first data byte."""
    version = np.lib.format.read_magic(fh)
    with _HEADER_LOCK:
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(fh)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(fh)
    raise ValueError(f"unsupported .npy format version {version}")


def load_sidecar(path: str | Path, expect_key: str | None = None) -> Sidecar:
    """Open a sidecar directory, verifying its meta and every array's header and size (nothing is mapped until
    an array is used); raise SidecarCorrupt if off."""
    path = Path(path)
    try:
        meta = SidecarMeta.model_validate_json((path / "meta.json").read_text())
    except (OSError, ValidationError, ValueError) as exc:
        raise SidecarCorrupt(f"{path}: meta.json missing or invalid ({exc})") from exc
    if expect_key is not None and meta.key != expect_key:
        raise SidecarCorrupt(f"{path}: key {meta.key} != expected {expect_key}")
    if meta.feature_version != FEATURE_VERSION:
        raise SidecarCorrupt(f"{path}: feature version {meta.feature_version} != {FEATURE_VERSION}")
    for name in ARRAYS:
        spec = meta.arrays.get(name)
        try:
            with open(path / f"{name}.npy", "rb") as fh:
                shape, fortran, dtype = _npy_header(fh)
                data_bytes = os.fstat(fh.fileno()).st_size - fh.tell()
        except (OSError, ValueError) as exc:
            raise SidecarCorrupt(f"{path}: {name}.npy unreadable ({exc})") from exc
        if (
            spec is None
            or str(dtype) != spec.dtype
            or list(shape) != spec.shape
            or fortran
            or not shape
            or shape[0] != meta.rows
        ):
            raise SidecarCorrupt(f"{path}: {name}.npy has {dtype}{list(shape)}, meta says {spec}")
        stored = STORED_DTYPES[meta.kind][name]
        if dtype != stored:  # readers size their buffers by it
            raise SidecarCorrupt(f"{path}: {name}.npy is {dtype}, a {meta.kind} sidecar stores {stored}")
        if data_bytes != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise SidecarCorrupt(
                f"{path}: {name}.npy holds {data_bytes} data bytes, {dtype}{list(shape)} needs "
                f"{dtype.itemsize * int(np.prod(shape, dtype=np.int64))}"
            )
    return Sidecar(path, meta)
