"""Window loader with the spec's `MultiHorizonLoader` contract, batching straight into torch tensors.

The sidecars are memory-mapped once at construction. Each epoch, `reset(seed)` draws a fresh
random order of window anchors (no disk IO); iteration yields up to `n_max_sequences` windows of
`seq_len` consecutive rows with features, time steps and labels at every position. A window never
spans two files, and windows whose first row has no finite label (the file's tail) are skipped.

On an accelerator (`device="cuda"`) the arrays are copied to device memory once and windows are
gathered there, so the host never becomes the bottleneck of a GPU training step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from alpha_core.data.norm import NormStats
from alpha_core.data.sidecar import Sidecar
from alpha_core.errors import DataError


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


def _windows(arr: np.ndarray, seq_len: int) -> np.ndarray:
    """Read-only view [N-K+1, K, ...] of every window; indexing it copies whole windows at once."""
    n = arr.shape[0] - seq_len + 1
    shape = (n, seq_len, *arr.shape[1:])
    strides = (arr.strides[0], *arr.strides)
    return np.lib.stride_tricks.as_strided(arr, shape=shape, strides=strides, writeable=False)


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
        """`resident` (default: on any non-CPU device) keeps all windows' data in device memory."""
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
        self._mean, self._std = (None, None) if norm is None else map(torch.from_numpy, norm.arrays())

        self._views = []
        anchors = []
        for sc in self.sidecars:
            if sc.rows < seq_len:
                continue
            views = {
                name: _windows(getattr(sc, name), seq_len)
                for name in ("features", "dt", "labels", "outcome_long", "outcome_short")
            }
            self._views.append(views)
            starts = np.flatnonzero(np.isfinite(sc.labels[: sc.rows - seq_len + 1]).any(axis=1))
            anchors.append(np.stack([np.full(len(starts), len(self._views) - 1), starts], axis=1))
        if not anchors or sum(len(a) for a in anchors) == 0:
            raise DataError(
                self.sidecars[0].path, f"no labelled window of seq_len={seq_len} in {len(self.sidecars)} file(s)"
            )
        self._file_of_view = [i for i, sc in enumerate(self.sidecars) if sc.rows >= seq_len]
        self._anchors = np.concatenate(anchors).astype(np.int64)
        self._order = self._anchors
        self._cursor = 0
        self.device = torch.device(device)
        self._resident: dict[str, torch.Tensor] | None = None
        self._order_device: torch.Tensor | None = None  # resident: this epoch's windows, on the device
        self._global_device: torch.Tensor | None = None
        if self.device.type != "cpu" if resident is None else resident:
            self._make_resident()
        self.reset(seed)

    def _make_resident(self) -> None:
        """Copy every used file's arrays to the device once, concatenated; windows become index arithmetic."""
        used = [self.sidecars[i] for i in self._file_of_view]
        names = ("features", "dt", "labels", "outcome_long", "outcome_short")
        self._resident = {
            name: torch.cat([torch.from_numpy(np.array(getattr(sc, name))) for sc in used]).to(self.device)
            for name in names
        }
        self._offsets = np.cumsum([0] + [sc.rows for sc in used[:-1]]).astype(np.int64)
        self._steps = torch.arange(self.seq_len, device=self.device)
        self._file_of_view_device = torch.as_tensor(self._file_of_view, device=self.device)
        if self._mean is not None:
            self._mean, self._std = self._mean.to(self.device), self._std.to(self.device)

    @property
    def n_windows(self) -> int:
        """Windows one epoch yields: min(n_max_sequences, labelled windows available)."""
        return min(self.n_max_sequences, len(self._anchors))

    def reset(self, seed: int) -> None:
        """Reshuffle anchors for a new epoch (no disk IO) and rewind."""
        rng = np.random.default_rng(seed)
        pick = rng.permutation(len(self._anchors))[: self.n_windows]
        self._order = self._anchors[pick]
        self._cursor = 0
        if self._resident is not None:  # in place: a captured CUDA graph keeps reading these buffers (`batch_at`)
            order = torch.from_numpy(self._order)
            first_rows = torch.from_numpy(self._offsets[self._order[:, 0]] + self._order[:, 1])
            if self._order_device is None:
                self._order_device = order.to(self.device)
                self._global_device = first_rows.to(self.device)
            else:
                self._order_device.copy_(order)
                self._global_device.copy_(first_rows)

    def yielded(self) -> int:
        return self._cursor

    def next_batch(self, batch_size: int, drop_last: bool = False) -> WindowBatch | None:
        remaining = self.n_windows - self._cursor
        if remaining <= 0 or (drop_last and remaining < batch_size):
            return None
        take = self._order[self._cursor : self._cursor + batch_size]
        if self._resident is not None:
            batch = self._gather_resident(slice(self._cursor, self._cursor + len(take)))
        else:
            batch = self._gather(take)
        self._cursor += len(take)
        return batch

    def next_sequence(self) -> WindowBatch | None:
        return self.next_batch(1)

    def batches(self, batch_size: int, drop_last: bool = False) -> Iterator[WindowBatch]:
        while (batch := self.next_batch(batch_size, drop_last)) is not None:
            yield batch

    def batch_at(self, positions: torch.Tensor) -> WindowBatch:
        """The windows at these positions of the epoch's order, computed on the device from device tensors only
        (resident loaders): a CUDA graph can capture it, with `positions` advanced inside the graph."""
        if self._resident is None:
            raise ValueError("batch_at needs a resident loader")
        return self._gather_resident(positions)

    def _gather_resident(self, rows: slice | torch.Tensor) -> WindowBatch:
        idx = self._global_device[rows, None] + self._steps  # [B, K] rows of the concatenated arrays
        r = self._resident
        x = r["features"][idx]
        if self._mean is not None:
            x = (x - self._mean) / self._std
        order = self._order_device[rows]
        files = self._file_of_view_device[order[:, 0]]
        return WindowBatch(x=x, dt=r["dt"][idx], labels=r["labels"][idx], outcome_long=r["outcome_long"][idx],
                           outcome_short=r["outcome_short"][idx], file_index=files, start=order[:, 1])

    def _gather(self, take: np.ndarray) -> WindowBatch:
        first = self._views[0]
        out = {
            name: np.empty((len(take), *view.shape[1:]), dtype=view.dtype) for name, view in first.items()
        }
        for v in np.unique(take[:, 0]):
            rows = np.flatnonzero(take[:, 0] == v)
            starts = take[rows, 1]
            for name, view in self._views[v].items():
                out[name][rows] = view[starts]
        x = torch.from_numpy(out["features"])
        if self._mean is not None:
            x.sub_(self._mean).div_(self._std)
        files = np.asarray(self._file_of_view, dtype=np.int64)[take[:, 0]]
        return WindowBatch(
            x=x,
            dt=torch.from_numpy(out["dt"]),
            labels=torch.from_numpy(out["labels"]),
            outcome_long=torch.from_numpy(out["outcome_long"]),
            outcome_short=torch.from_numpy(out["outcome_short"]),
            file_index=torch.from_numpy(files),
            start=torch.from_numpy(take[:, 1].copy()),
        )
