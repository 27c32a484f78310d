"""Stream one DBN file into a sidecar's `.npy` arrays, in memory that does not depend on the file's size.

The first pass over the file (`series.read_book` / `read_bars`) gives the row count, so every `.npy`
header is written first and the rows are appended as they come. The second pass yields the front-month
rows chunk by chunk; features (`features.BookFeatures` / `BarFeatures`) and labels (`labels.LabelStream`)
carry only what the next chunk needs. Nothing is memory-mapped while writing, so the page cache of what
was written never counts as this process's memory. What is written goes to disk while the build runs
(`WriteBack`), not all at once in the fsync that publishes the sidecar. Features and labels are computed in
float32 and stored as `sidecar.STORED_DTYPES` says (the book's as float16: `stored_form`).

The row count also gives the sidecar's size before anything is written: over `ALPHA_MAX_SIDECAR_BYTES`, or over
the cache's free space, the build stops there.
"""

from __future__ import annotations

import errno
import os
import queue
import shutil
import threading
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from alpha_core.bounds import MAX_SIDECAR_BYTES, input_bound
from alpha_core.data import labels as lbl
from alpha_core.data.dbn import DbnFile
from alpha_core.data.features import BAR_FEATURES, BOOK_FEATURES, BarFeatures, BookFeatures
from alpha_core.data.front_month import Roll
from alpha_core.data.layout import BOOK, STORED_DTYPES, column_sums
from alpha_core.data.products import Product
from alpha_core.data.series import read_bars, read_book
from alpha_core.data.validate import RecordRange
from alpha_core.errors import DataError

WRITEBACK_BYTES = 16 << 20  # a file's bytes written between two background flushes
FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504


def stored_form(rows: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`rows` cast to the dtype they are stored in, contiguous. Into float16 a value beyond its finite range
    saturates at +-65504 instead of becoming inf: the build checks finiteness on the float32 values, so a huge one
    (an absurd spread, which the integrity checks flag by MAX_SPREAD_TICKS) must not turn non-finite after it."""
    if dtype == np.float16 and rows.dtype != np.float16:
        rows = np.clip(rows, -FLOAT16_MAX, FLOAT16_MAX)  # NaN (a missing label) stays NaN
    return np.ascontiguousarray(rows, dtype=dtype)


class WriteBack:
    """Flush files to disk in a background thread while they are still being written.

    A quarter's sidecar is some 400 MB. Left in the page cache until `atomic_directory` fsyncs it, all of it
    is written then, while the build waits (about 0.5 s of the whole build on the development VM); flushed as
    it comes, it is written during the build's computation instead. A flush that fails is raised in the
    building thread (by `submit` or on leaving the `with` block): it must not be lost, since the later fsync
    on a new descriptor would not report it again.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="sidecar-writeback", daemon=True)

    def __enter__(self) -> WriteBack:
        self._thread.start()
        return self

    def __exit__(self, exc_type, *_: object) -> None:
        self._queue.put(None)
        self._thread.join()  # before the files close: a flush must not reach a closed (or reused) descriptor
        if exc_type is None:
            self._raise()

    def submit(self, fh: BinaryIO) -> None:
        """Flush what `fh` has written so far (its Python buffer now, the page cache in the background)."""
        self._raise()
        fh.flush()
        self._queue.put(fh.fileno())

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        sync = getattr(os, "fdatasync", os.fsync)
        while (fd := self._queue.get()) is not None:
            if self._error is None:
                try:
                    sync(fd)
                except OSError as exc:
                    self._error = exc


class NpyAppender:
    """A `.npy` file of a known shape written row block by row block (the bytes `np.save` would write)."""

    def __init__(
        self, fh: BinaryIO, path: Path, dtype: np.dtype, shape: tuple[int, ...], writeback: WriteBack | None = None
    ) -> None:
        self.fh, self.path, self.dtype, self.shape = fh, path, np.dtype(dtype), shape
        self.rows = 0
        self.writeback, self.unflushed = writeback, 0
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(fh, header)

    def write(self, rows: np.ndarray) -> None:
        rows = stored_form(rows, self.dtype)
        if rows.shape[1:] != self.shape[1:] or self.rows + len(rows) > self.shape[0]:
            raise AssertionError(f"{self.path.name}: rows {rows.shape} do not fit {self.shape} after {self.rows}")
        self.fh.write(rows.data)
        self.rows += len(rows)
        self.unflushed += rows.nbytes
        if self.writeback is not None and self.unflushed >= WRITEBACK_BYTES:
            self.writeback.submit(self.fh)
            self.unflushed = 0


@dataclass
class Built:
    """What `meta.json` says about the arrays that were written."""

    feature_names: tuple[str, ...]
    rows: int
    first_ts: int
    last_ts: int
    contracts: dict[int, int]  # instrument_id -> rows
    rolls: list[Roll]
    dropped: dict[str, int]
    arrays: dict[str, tuple[str, list[int]]] = field(default_factory=dict)  # name -> (dtype, shape)
    records: RecordRange | None = None  # every record of the file, from pass 1
    feature_sum: list[float] = field(default_factory=list)  # per feature over every row as stored (float64 sums)
    feature_sum_sq: list[float] = field(default_factory=list)


def build_arrays(out: Path, info: DbnFile, kind: str, prod: Product, horizons: tuple[int, ...], cost: float) -> Built:
    """Write `features`, `ts`, `price`, `dt`, `trade_ts`, `labels`, `outcome_long`, `outcome_short` and
    `instrument_id` (`{name}.npy` under `out`) for the front-month series of `prod` in `info`."""
    if kind == BOOK:
        source = read_book(info, prod.root)
        feats, names, unit = BookFeatures(prod.tick_size), BOOK_FEATURES, lbl.SNAPSHOTS
    else:
        source = read_bars(info, prod.root)
        feats, names, unit = BarFeatures(), BAR_FEATURES, lbl.MINUTES
    n, h = source.rows, len(horizons)
    width = {"features": (len(names),), "labels": (h,), "outcome_long": (h,), "outcome_short": (h,)}
    specs = {name: (dtype, (n, *width.get(name, ()))) for name, dtype in STORED_DTYPES[kind].items()}
    _check_size(out, info, n, specs)
    labels = lbl.LabelStream(unit, horizons, feats.price_scale, cost)
    finite = np.ones(len(names), dtype=bool)
    total, total_sq = np.zeros(len(names)), np.zeros(len(names))
    first_ts = last_ts = None
    with ExitStack() as files:
        handles = {name: files.enter_context((out / f"{name}.npy").open("wb")) for name in specs}
        writeback = files.enter_context(WriteBack())  # left first: its flushes end before the files close
        npy = {
            name: NpyAppender(handles[name], out / f"{name}.npy", dtype, shape, writeback)
            for name, (dtype, shape) in specs.items()
        }
        for chunk in source.chunks():
            f = feats(chunk)  # float32, checked before `stored_form` narrows the book's to float16
            ok = np.isfinite(f.values)
            if not ok.all():  # a flat pass; the per-feature reduction only where something is off
                finite &= ok.all(axis=0)
            stored = stored_form(f.values, specs["features"][0])
            sums, sums_sq = column_sums(stored)  # what normalisation needs, of the values readers get
            total += sums
            total_sq += sums_sq
            npy["features"].write(stored)
            npy["ts"].write(f.ts)
            npy["price"].write(f.price_fixed / f.price_scale)
            npy["dt"].write(f.dt)
            npy["trade_ts"].write(chunk.trade_ts if kind == BOOK else f.ts + (lbl.NS_PER_MINUTE - 1))
            npy["instrument_id"].write(chunk.instrument_id)
            _write_labels(npy, labels.push(f.price_fixed, f.ts))
            first_ts = int(f.ts[0]) if first_ts is None else first_ts
            last_ts = int(f.ts[-1])
        _write_labels(npy, labels.finish())
        if not finite.all():
            bad = np.flatnonzero(~finite)
            raise DataError(info.path, f"non-finite feature values in {[names[i] for i in bad]}")
        short = {name: a.rows for name, a in npy.items() if a.rows != n}
        if short:
            raise AssertionError(f"{info.path}: {n} rows expected, written {short}")
    arrays = {name: (np.dtype(dtype).name, list(shape)) for name, (dtype, shape) in specs.items()}
    return Built(
        names,
        n,
        first_ts,
        last_ts,
        source.contracts,
        source.front.rolls,
        source.dropped,
        arrays,
        source.records,
        total.tolist(),
        total_sq.tolist(),
    )


def _check_size(out: Path, info: DbnFile, rows: int, specs: dict[str, tuple]) -> None:
    """Refuse a sidecar larger than `ALPHA_MAX_SIDECAR_BYTES` or than the free space, before writing it."""
    need = sum(np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)) for dtype, shape in specs.values())
    limit = input_bound(MAX_SIDECAR_BYTES)
    if need > limit:
        raise DataError(
            info.path,
            f"its sidecar would take {need:,} bytes ({rows:,} rows), over the limit of {limit:,} (ALPHA_MAX_SIDECAR_BYTES)",
        )
    free = shutil.disk_usage(out).free
    if need > free:
        raise OSError(errno.ENOSPC, f"the sidecar of {info.name} needs {need:,} bytes, {free:,} are free")


def _write_labels(npy: dict[str, NpyAppender], labels: lbl.Labels) -> None:
    npy["labels"].write(labels.direction)
    npy["outcome_long"].write(labels.outcome_long)
    npy["outcome_short"].write(labels.outcome_short)
