"""Window loader with the original system's `MultiHorizonLoader` contract, batching straight into torch tensors.

Each epoch, `reset(seed)` draws a fresh random set of up to `n_max_sequences` windows of `seq_len`
consecutive rows with features, time steps and labels at every position. A window never spans two files,
and windows whose first row has no finite label (the file's tail) are never drawn.

Memory does not grow with the files. The windows' valid starts are a few ranges per file, never a per-row
list: the book's labels count snapshots, so a book file's labelled rows are one prefix and its starts one
range, [0, min(rows - seq_len + 1, rows - shortest horizon)), from the meta (checked at both ends); a bar
file's (NaN on a flat move or a gap) are the runs of labelled rows, read once in blocks. An epoch draws
`n_windows` distinct ranks among all valid starts (`Generator.choice` without replacement: Floyd's algorithm,
or where n is over 1/50 of the starts a partial shuffle of them, so O(n) memory either way; the same draws for
the same seed) and maps each to (file, start) by a search on the ranges' cumulative counts: O(ranges + n)
memory, and every valid start equally likely, as with the old full permutation.

The epoch's rows. `reset` copies the rows the drawn windows read (their union: overlapping windows share
rows) into one buffer of fixed capacity, n_windows x seq_len rows, reading the rows in blocks with
plain reads (`take_rows`); a window is then K consecutive rows of that buffer, copied whole into its batch. An
epoch that would read about every row (n_windows x seq_len >= the files' rows) keeps every row instead, copied
once. The buffer sits on the device (`resident`, the default on any non-CPU device: what an epoch reads, not
every file) or on the host, and `reset` refills it in place, so a captured CUDA graph (`batch_at` through an
`EpochCursor`) keeps reading the same memory across epochs. The buffer keeps the stored dtypes (a book's features
and labels are float16, `sidecar.STORED_DTYPES`) and a batch is upcast to float32 as it is gathered. Device memory:
capacity x (2F + 4 + 2H + 8H) bytes for the book, capacity x (4F + 4 + 12H) for bars (features, dt, the three label
arrays) + 24 bytes per window.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from alpha_core.data.norm import NormStats
from alpha_core.data.sidecar import HORIZON_UNIT, Sidecar, take_rows
from alpha_core.errors import DataError

ARRAYS = ("features", "dt", "labels", "outcome_long", "outcome_short")  # what a window carries
STAGE_ROWS = 1 << 16  # rows copied per block (9 MiB of book rows): the host's share of an epoch's gather
SCAN_ROWS = 1 << 20  # rows of labels read per block when a bar file's labelled runs are found
FUSED_GATHER = importlib.util.find_spec("triton") is not None  # `window_gather` is Triton; without it, torch


@dataclass
class WindowBatch:
    x: torch.Tensor  # float32 [B, K, F], normalised when the loader has stats
    dt: torch.Tensor  # float32 [B, K] seconds since the previous row
    labels: torch.Tensor  # float32 [B, K, H] direction, NaN = no label
    outcome_long: torch.Tensor  # float32 [B, K, H]
    outcome_short: torch.Tensor  # float32 [B, K, H]
    file_index: torch.Tensor  # int64 [B]
    start: torch.Tensor  # int64 [B] first row of each window in its file

    def __len__(self) -> int:
        return self.x.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> WindowBatch:
        return WindowBatch(*(t.to(device, non_blocking=non_blocking) for t in self.__dict__.values()))


def valid_ranges(sc: Sidecar, seq_len: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of the rows where a window may start: it fits in the file and its first row has a label.

    Book labels count snapshots (`labels.future_rows_by_count`): exactly the rows before the last
    `min(horizons)` have one, so the range is arithmetic, checked at its two ends (a file that disagrees, e.g. a
    truncated copy, is scanned). Bar labels have gaps: their runs are read in blocks."""
    last = sc.rows - seq_len + 1  # starts whose window fits
    if last <= 0:
        return []
    if sc.meta.horizon_unit == HORIZON_UNIT["book"]:
        hi = min(last, sc.rows - min(sc.meta.horizons))
        labelled = lambda r: bool(np.isfinite(sc.read("labels", r, r + 1)).any())  # noqa: E731
        if hi <= 0 and not labelled(0):
            return []
        if hi > 0 and labelled(0) and labelled(hi - 1) and (hi == last or not labelled(hi)):
            return [(0, hi)]
    runs: list[tuple[int, int]] = []
    for a in range(0, last, SCAN_ROWS):
        ok = np.isfinite(sc.read("labels", a, min(a + SCAN_ROWS, last))).any(axis=1)
        edges = np.flatnonzero(np.diff(np.r_[False, ok, False].astype(np.int8)))
        for lo, hi in zip(edges[::2] + a, edges[1::2] + a, strict=True):
            if runs and runs[-1][1] == lo:
                runs[-1] = (runs[-1][0], int(hi))
            else:
                runs.append((int(lo), int(hi)))
    return runs


class WindowLoader:
    def __init__(
        self,
        sidecars: Sequence[Sidecar],
        seq_len: int,
        n_max_sequences: int,
        seed: int,
        norm: NormStats | None = None,
        device: torch.device | str = "cpu",
        resident: bool | None = None,
    ) -> None:
        """`resident` (default: on any non-CPU device) keeps the epoch's rows in device memory."""
        if seq_len < 1:
            raise DataError(None, f"seq_len must be >= 1 (got {seq_len})")
        if not sidecars:
            raise DataError(None, "the loader needs at least one sidecar")
        self.sidecars = list(sidecars)
        self.seq_len = seq_len
        self.n_max_sequences = n_max_sequences
        names = self.sidecars[0].meta.feature_names
        for sc in self.sidecars:
            if sc.meta.feature_names != names or sc.meta.horizons != self.sidecars[0].meta.horizons:
                raise DataError(sc.path, "feature names or horizons differ from the loader's first file")
        if norm is not None and norm.feature_names != names:
            raise DataError(None, "norm_stats feature_names do not match the sidecars")
        self.device = torch.device(device)
        on_device = self.device.type != "cpu" if resident is None else resident
        self.buffer_device = self.device if on_device else torch.device("cpu")
        self._resident = on_device

        ranges = [(i, lo, hi) for i, sc in enumerate(self.sidecars) for lo, hi in valid_ranges(sc, seq_len)]
        if not ranges:
            raise DataError(self.sidecars[0].path, f"no labelled window of seq_len={seq_len} in {len(self.sidecars)} file(s)")
        self._ranges = np.array(ranges, dtype=np.int64)  # [R, 3]: file, first start, end of starts
        self._cum = np.cumsum(self._ranges[:, 2] - self._ranges[:, 1])  # valid starts up to each range's end
        self.n_windows = min(self.n_max_sequences, int(self._cum[-1]))  # windows one epoch yields

        used = sorted({int(f) for f in self._ranges[:, 0]})
        rows = np.array([self.sidecars[f].rows for f in used], dtype=np.int64)
        # an epoch that reads about every row keeps every row, copied once (the layout never changes)
        self._whole = self.n_windows * seq_len >= rows.sum()
        capacity = int(rows.sum()) if self._whole else self.n_windows * seq_len
        dev = self.buffer_device
        first = self.sidecars[used[0]]
        self._buf = {
            name: torch.empty(
                (capacity, *first.meta.arrays[name].shape[1:]), device=dev, dtype=getattr(torch, first.meta.arrays[name].dtype)
            )
            for name in ARRAYS
        }
        # [capacity - K + 1, K, ...] views of the buffer: window i is rows i..i+K-1
        self._windows = {
            name: buf.as_strided((capacity - seq_len + 1, seq_len, *buf.shape[1:]), (buf.stride(0), *buf.stride()))
            for name, buf in self._buf.items()
        }
        self._first = torch.zeros(self.n_windows, dtype=torch.long, device=dev)  # each window's row in the buffer
        self._file = torch.zeros(self.n_windows, dtype=torch.long, device=dev)
        self._start = torch.zeros(self.n_windows, dtype=torch.long, device=dev)
        self._mean, self._std = (None, None) if norm is None else (torch.from_numpy(a).to(dev) for a in norm.arrays())
        self._layout: np.ndarray | None = None  # the buffer's (file, lo, hi) row intervals
        self._at = np.zeros(len(self.sidecars), dtype=np.int64)  # whole files: each file's first buffer row
        if self._whole:
            layout = np.stack([np.array(used), np.zeros_like(rows), rows], axis=1)
            self._at[used] = np.r_[0, np.cumsum(rows)[:-1]]
            self._fill(layout, self._at[used])
            self._layout = layout
        self._cursor = 0
        self.reset(seed)

    def draw(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(file, start) of this seed's `n_windows` windows, in the epoch's order."""
        rank = np.random.default_rng(seed).choice(int(self._cum[-1]), size=self.n_windows, replace=False)
        r = np.searchsorted(self._cum, rank, side="right")
        start = self._ranges[r, 1] + rank - (self._cum[r] - (self._ranges[r, 2] - self._ranges[r, 1]))
        return self._ranges[r, 0], start

    def reset(self, seed: int) -> None:
        """Draw the epoch's windows, copy their rows into the buffer (in place) and rewind."""
        files, starts = self.draw(seed)
        first = self._at[files] + starts if self._whole else self._pack(files, starts)
        for dst, src in ((self._first, first), (self._file, files), (self._start, starts)):
            dst.copy_(torch.from_numpy(np.ascontiguousarray(src)))
        self._cursor = 0

    def _pack(self, files: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Lay the windows' rows out in the buffer (refilled when the layout changed); each window's first row."""
        order = np.lexsort((starts, files))
        f, s = files[order], starts[order]
        # union of [s, s + K) per file: a new interval where a window starts after the previous one's end
        new = np.r_[True, (f[1:] != f[:-1]) | (s[1:] > s[:-1] + self.seq_len)]
        group = np.cumsum(new) - 1
        lo = s[new]
        hi = np.maximum.reduceat(s, np.flatnonzero(new)) + self.seq_len
        at = np.r_[0, np.cumsum(hi - lo)[:-1]]  # each interval's first row in the buffer
        first = np.empty(len(s), dtype=np.int64)
        first[order] = at[group] + s - lo[group]
        layout = np.stack([f[new], lo, hi], axis=1)
        if self._layout is None or not np.array_equal(layout, self._layout):
            self._fill(layout, at)
            self._layout = layout
        return first

    def _fill(self, layout: np.ndarray, at: np.ndarray) -> None:
        """Copy the rows of each (file, lo, hi) interval to the buffer at `at`, in blocks of STAGE_ROWS rows."""
        for file in np.unique(layout[:, 0]):
            mine = np.flatnonzero(layout[:, 0] == file)
            lengths = layout[mine, 2] - layout[mine, 1]
            rows = np.repeat(layout[mine, 1] - np.r_[0, np.cumsum(lengths)[:-1]], lengths) + np.arange(lengths.sum())
            dst = int(at[mine[0]])  # one file's intervals are consecutive in the buffer
            for name in ARRAYS:
                for b in range(0, len(rows), STAGE_ROWS):
                    block = take_rows(self.sidecars[file], name, rows[b : b + STAGE_ROWS])
                    self._buf[name][dst + b : dst + b + len(block)].copy_(torch.from_numpy(block))

    def yielded(self) -> int:
        return self._cursor

    def next_batch(self, batch_size: int, drop_last: bool = False) -> WindowBatch | None:
        remaining = self.n_windows - self._cursor
        if remaining <= 0 or (drop_last and remaining < batch_size):
            return None
        take = min(batch_size, remaining)
        batch = self._gather(slice(self._cursor, self._cursor + take))
        self._cursor += take
        return batch

    def batches(self, batch_size: int, drop_last: bool = False) -> Iterator[WindowBatch]:
        while (batch := self.next_batch(batch_size, drop_last)) is not None:
            yield batch

    def batch_at(self, positions: torch.Tensor) -> WindowBatch:
        """The windows at these positions of the epoch's order (each in [0, n_windows)), computed on the device
        from device tensors only (resident loaders): a CUDA graph can capture it, with `positions` advanced inside
        the graph (`EpochCursor`, which keeps them in range)."""
        if not self._resident:
            raise ValueError("batch_at needs a resident loader")
        return self._gather(positions)

    def batch_at_cursor(self, cursor: torch.Tensor, batch_size: int) -> WindowBatch:
        """`batch_at` of positions cursor .. cursor + batch_size - 1, clamped to the epoch's last window, in one
        Triton kernel (`window_gather`; resident loaders). The caller advances the cursor."""
        if not self._resident:
            raise ValueError("batch_at_cursor needs a resident loader")
        from alpha_core.data.window_gather import gather_windows  # Triton: imported where it runs

        out = gather_windows(
            cursor, batch_size, self.seq_len, self._first, self._file, self._start, self._buf, self._mean, self._std
        )
        return WindowBatch(**out)

    def _gather(self, rows: slice | torch.Tensor) -> WindowBatch:
        """The windows at `rows` of the epoch, features and labels as float32 (tensor ops only: capturable)."""
        first = self._first[rows]  # each window is K consecutive rows of the buffer: copied whole
        out = {name: windows.index_select(0, first) for name, windows in self._windows.items()}
        x = out["features"].float()  # normalised in float32, whatever the stored dtype
        if self._mean is not None:
            x = (x - self._mean) / self._std
        return WindowBatch(
            x=x,
            dt=out["dt"],
            labels=out["labels"].float(),
            outcome_long=out["outcome_long"],
            outcome_short=out["outcome_short"],
            file_index=self._file[rows],
            start=self._start[rows],
        )


class EpochOverrun(RuntimeError):
    """A captured step asked for a batch past the end of the epoch's windows."""


class EpochCursor:
    """Where a captured training step reads its batch: a device cursor into the loader's epoch order that the
    step (a CUDA graph) advances by one batch per replay. Its positions are clamped on the device to the epoch's
    last window, so no replay can index past the buffers (a device-side assert would kill the CUDA context);
    and the host counts the batches handed out and refuses one past the epoch's whole batches with an
    `EpochOverrun` naming it (`claim`, before each replay), so the clamp never silently repeats a window."""

    def __init__(self, loader: WindowLoader, batch_size: int) -> None:
        self.loader, self.batch_size = loader, batch_size
        self.batches_per_epoch = loader.n_windows // batch_size
        dev = loader.buffer_device
        self.cursor = torch.zeros((), dtype=torch.long, device=dev)
        self.offsets = torch.arange(batch_size, device=dev)
        self.taken = 0

    def rewind(self) -> None:
        """At each epoch's start, after the loader's `reset`."""
        self.cursor.zero_()
        self.taken = 0

    def claim(self) -> None:
        if self.taken >= self.batches_per_epoch:
            raise EpochOverrun(
                f"batch {self.taken + 1} asked of an epoch of {self.batches_per_epoch} batches of {self.batch_size} "
                f"({self.loader.n_windows} windows): rewind the cursor after the loader's reset"
            )
        self.taken += 1

    def positions(self) -> torch.Tensor:
        """This batch's positions in the epoch order (device ops only: capturable), advancing the cursor."""
        pos = (self.cursor + self.offsets).clamp_(max=self.loader.n_windows - 1)
        self.cursor.add_(self.batch_size)
        return pos

    def next_batch(self) -> WindowBatch:
        """This batch, advancing the cursor (device ops only: capturable). On cuda one Triton kernel gathers it
        (`window_gather`: at batch 1 the torch gather's 15 kernels were a tenth of the step), else torch."""
        if self.loader.buffer_device.type != "cuda" or not FUSED_GATHER:
            return self.loader.batch_at(self.positions())
        batch = self.loader.batch_at_cursor(self.cursor, self.batch_size)
        self.cursor.add_(self.batch_size)
        return batch
