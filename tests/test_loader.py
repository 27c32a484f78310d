"""Window loader contract (the original system's MultiHorizonLoader) and normalisation statistics."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from alpha_core.data.loader import EpochCursor, EpochOverrun, WindowLoader, valid_ranges
from alpha_core.data.norm import NormStats, fit_norm_stats
from alpha_core.data.sidecar import ARRAYS, Sidecar
from alpha_core.errors import DataError


def test_batches_are_windows_of_one_file_with_labels_at_every_position(tiny_sidecars):
    files = tiny_sidecars["book"][:2]
    loader = WindowLoader(files, seq_len=64, n_max_sequences=300, seed=1)
    assert loader.n_windows == 300
    seen = 0
    for batch in loader.batches(128):
        b = len(batch)
        assert batch.x.shape == (b, 64, len(files[0].meta.feature_names)) and batch.x.dtype == torch.float32
        assert batch.dt.shape == (b, 64) and batch.labels.shape == batch.outcome_long.shape == (b, 64, 3)
        for i in range(b):
            sc = files[int(batch.file_index[i])]
            s = int(batch.start[i])
            assert s + 64 <= sc.rows, "a window never runs past its file"
            np.testing.assert_array_equal(batch.x[i].numpy(), sc.features[s : s + 64])
            np.testing.assert_array_equal(batch.labels[i].numpy(), sc.labels[s : s + 64])
            np.testing.assert_array_equal(batch.dt[i].numpy(), sc.dt[s : s + 64])
            assert np.isfinite(sc.labels[s]).any(), "windows start where a label exists"
        seen += b
    assert seen == loader.yielded() == 300
    assert loader.next_batch(8) is None


def test_reset_reshuffles_deterministically_without_io(tiny_sidecars):
    loader = WindowLoader(tiny_sidecars["book"], seq_len=32, n_max_sequences=100, seed=5)
    first = loader.next_batch(100).start.tolist()
    loader.reset(5)
    assert loader.yielded() == 0
    assert loader.next_batch(100).start.tolist() == first
    loader.reset(6)
    assert loader.next_batch(100).start.tolist() != first


def test_epoch_is_capped_by_available_windows_and_drop_last(tiny_sidecars):
    sc = tiny_sidecars["book"][0]
    loader = WindowLoader([sc], seq_len=64, n_max_sequences=10**9, seed=0)
    available = int(np.isfinite(sc.labels[: sc.rows - 63]).any(axis=1).sum())
    assert loader.n_windows == available
    assert sum(len(b) for b in loader.batches(1000, drop_last=True)) == available // 1000 * 1000


def test_normalisation_uses_training_statistics(tiny_sidecars):
    train, val = tiny_sidecars["book"][:2], tiny_sidecars["book"][2]
    stats = fit_norm_stats(train)
    stacked = np.concatenate([np.asarray(sc.features, dtype=np.float64) for sc in train])
    np.testing.assert_allclose(stats.mean, stacked.mean(axis=0), rtol=1e-6, atol=1e-9)
    expected_std = stacked.std(axis=0)
    expected_std[expected_std < 1e-6] = 1.0
    np.testing.assert_allclose(stats.std, expected_std, rtol=1e-5, atol=1e-9)
    assert stats.sources == [sc.meta.source.sha256 for sc in train]

    loader = WindowLoader([val], seq_len=16, n_max_sequences=50, seed=0, norm=stats)
    batch = loader.next_batch(50)
    mean, std = stats.arrays()
    raw = np.stack([val.features[s : s + 16] for s in batch.start.tolist()])
    np.testing.assert_allclose(batch.x.numpy(), (raw - mean) / std, rtol=1e-5, atol=1e-5)


def test_norm_stats_round_trip_and_strict_schema(tiny_sidecars, tmp_path):
    stats = fit_norm_stats(tiny_sidecars["bars"][:2])
    path = stats.save(tmp_path / "norm_stats.json")
    assert NormStats.load(path) == stats
    bad = json.loads(path.read_text())
    bad["extra_key"] = 1
    path.write_text(json.dumps(bad))
    with pytest.raises(DataError, match=r"norm_stats.json: invalid norm_stats.json: extra_key: Extra inputs are not permitted"):
        NormStats.load(path)


def test_loader_rejects_mismatched_inputs(tiny_sidecars):
    with pytest.raises(DataError, match="feature names or horizons differ"):
        WindowLoader([tiny_sidecars["book"][0], tiny_sidecars["bars"][0]], 8, 10, 0)
    with pytest.raises(DataError, match="no labelled window of seq_len=100000"):
        WindowLoader(tiny_sidecars["bars"][:1], 100_000, 10, 0)
    with pytest.raises(DataError, match="norm_stats feature_names do not match"):
        WindowLoader(tiny_sidecars["book"][:1], 8, 10, 0, norm=fit_norm_stats(tiny_sidecars["bars"][:1]))


def test_device_resident_gather_equals_host_gather(tiny_sidecars):
    """The GPU path (arrays in device memory, windows by index arithmetic) yields the same batches."""
    files = tiny_sidecars["book"][:2]
    stats = fit_norm_stats(files)
    host = WindowLoader(files, seq_len=32, n_max_sequences=200, seed=3, norm=stats)
    resident = WindowLoader(files, seq_len=32, n_max_sequences=200, seed=3, norm=stats, resident=True)
    for a, b in zip(host.batches(64), resident.batches(64), strict=True):
        for name in ("x", "dt", "labels", "outcome_long", "outcome_short", "file_index", "start"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name), equal_nan=True)


def test_batch_at_device_positions_equals_the_epochs_batches_after_an_in_place_reshuffle(tiny_sidecars):
    """What a captured CUDA graph gathers (positions from a device cursor) is the epoch's batches, also after
    `reset` drew other windows into the same buffers the graph keeps reading."""
    files = tiny_sidecars["book"][:2]
    loader = WindowLoader(files, seq_len=32, n_max_sequences=200, seed=3, norm=fit_norm_stats(files), resident=True)
    buffers = [t.data_ptr() for t in (*loader._buf.values(), loader._first, loader._file, loader._start)]
    cursor = EpochCursor(loader, 64)
    for epoch_seed in (3, 4):
        loader.reset(epoch_seed)
        expected = list(loader.batches(64, drop_last=True))
        cursor.rewind()
        for batch in expected:
            cursor.claim()
            got = cursor.next_batch()
            for name in ("x", "dt", "labels", "outcome_long", "outcome_short", "file_index", "start"):
                torch.testing.assert_close(getattr(got, name), getattr(batch, name), equal_nan=True)
    assert [t.data_ptr() for t in (*loader._buf.values(), loader._first, loader._file, loader._start)] == buffers


def _anchors(sc, seq_len: int) -> set[int]:
    """The old loader's per-row anchors: every start whose window fits and whose first row has a label."""
    return set(np.flatnonzero(np.isfinite(np.asarray(sc.labels)[: sc.rows - seq_len + 1]).any(axis=1)).tolist())


@pytest.mark.parametrize("kind", ["book", "bars"])
def test_valid_ranges_are_the_old_per_row_anchors(tiny_sidecars, kind):
    """Ranges (book: arithmetic on the meta; bars: runs read in blocks) cover exactly the starts the old loader
    listed row by row, also for a truncated copy whose tail keeps the full file's labels."""
    sc = tiny_sidecars[kind][0]
    cut = _truncated(sc, sc.rows // 2)
    for f in (sc, cut):
        for seq_len in (1, 16, 64):
            ranges = valid_ranges(f, seq_len)
            starts = {s for lo, hi in ranges for s in range(lo, hi)}
            assert starts == _anchors(f, seq_len) and sum(hi - lo for lo, hi in ranges) == len(starts)
    assert len(valid_ranges(tiny_sidecars["book"][0], 64)) == 1


def test_a_book_file_s_starts_come_from_its_meta_not_its_rows(tiny_sidecars, monkeypatch):
    """The book loader reads at most 3 label rows per file to find its windows, however long the file."""
    read = []
    honest = Sidecar.read
    monkeypatch.setattr(Sidecar, "read", lambda self, name, a, b: read.append((name, b - a)) or honest(self, name, a, b))
    for sc in tiny_sidecars["book"][:3]:
        valid_ranges(sc, 64)
    assert set(read) == {("labels", 1)} and len(read) <= 9


def test_the_sampler_is_deterministic_distinct_and_never_crosses_a_file(tiny_sidecars):
    files = tiny_sidecars["book"][:3]
    loader = WindowLoader(files, seq_len=64, n_max_sequences=500, seed=0)
    f1, s1 = loader.draw(11)
    f2, s2 = loader.draw(11)
    np.testing.assert_array_equal(f1, f2)
    np.testing.assert_array_equal(s1, s2)
    f3, s3 = loader.draw(12)
    assert not (np.array_equal(f1, f3) and np.array_equal(s1, s3))
    assert len(set(zip(f1.tolist(), s1.tolist(), strict=True))) == 500  # without replacement
    for f, s in zip(f1.tolist(), s1.tolist(), strict=True):
        assert s in _anchors(files[f], 64) and s + 64 <= files[f].rows
    # every valid start once when the epoch asks for all of them (the old full permutation's set)
    everything = WindowLoader(files, seq_len=64, n_max_sequences=10**9, seed=0)
    f, s = everything.draw(5)
    assert sorted(zip(f.tolist(), s.tolist(), strict=True)) == sorted(
        (i, a) for i, sc in enumerate(files) for a in _anchors(sc, 64)
    )


@pytest.mark.slow
def test_the_buffer_holds_what_an_epoch_reads(tiny_sidecars):
    """Capacity min(n_windows x seq_len, rows of the files); a small epoch's rows are the union of its windows."""
    files = tiny_sidecars["book"][:3]
    total = sum(sc.rows for sc in files)
    small = WindowLoader(files, seq_len=32, n_max_sequences=50, seed=2)
    assert small._buf["features"].shape[0] == 50 * 32 < total
    files_, starts = small.draw(2)
    union = {(f, r) for f, s in zip(files_.tolist(), starts.tolist(), strict=True) for r in range(s, s + 32)}
    assert int(small._layout[:, 2].sum() - small._layout[:, 1].sum()) == len(union)
    assert WindowLoader(files, seq_len=32, n_max_sequences=10**6, seed=2)._buf["features"].shape[0] == total
    for loader in (small, WindowLoader(files, seq_len=32, n_max_sequences=10**6, seed=2)):
        for epoch in range(2):
            loader.reset(epoch)
            for batch in loader.batches(16):
                for i in range(len(batch)):
                    sc, s = files[int(batch.file_index[i])], int(batch.start[i])
                    np.testing.assert_array_equal(batch.x[i].numpy(), sc.features[s : s + 32])
                    np.testing.assert_array_equal(batch.outcome_short[i].numpy(), sc.outcome_short[s : s + 32])


def test_a_captured_step_s_cursor_stays_in_the_epoch_and_refuses_to_run_past_it(tiny_sidecars):
    """The bounds a CUDA graph's cursor lives by, on the CPU: the host refuses the batch after the epoch's whole
    batches (a clear error, not a device-side assert), and the device positions never leave the epoch even if
    the cursor is pushed past it."""
    loader = WindowLoader(tiny_sidecars["book"][:2], seq_len=16, n_max_sequences=100, seed=0, resident=True)
    cursor = EpochCursor(loader, 32)
    assert cursor.batches_per_epoch == 3
    for _ in range(3):
        cursor.claim()
        assert int(cursor.positions().max()) < 100
    with pytest.raises(EpochOverrun, match=r"batch 4 asked of an epoch of 3 batches of 32 \(100 windows\)"):
        cursor.claim()
    pos = cursor.positions()  # what a replay past the end would gather: clamped, so in range on any device
    assert pos.tolist() == [96, 97, 98, 99] + [99] * 28
    cursor.cursor.fill_(10**6)
    assert int(cursor.positions().max()) == 99 and len(cursor.next_batch()) == 32
    cursor.rewind()
    cursor.claim()
    assert cursor.positions().tolist() == list(range(32))
    with pytest.raises(ValueError, match="batch_at needs a resident loader"):
        WindowLoader(tiny_sidecars["book"][:1], 16, 10, 0).batch_at(torch.arange(2))


GATHER_CHECK = """
import sys, torch
from alpha_core.data.loader import EpochCursor, WindowLoader
from alpha_core.data.norm import fit_norm_stats
from alpha_core.data.sidecar import load_sidecar
for kind, paths in (("book", sys.argv[1].split(",")), ("bars", sys.argv[2].split(","))):
    files = [load_sidecar(p) for p in paths]
    for norm in (None, fit_norm_stats(files)):
        # seq_len 40: a full block of 32 positions and a masked one; 50 windows: batch 37 runs past the end
        loader = WindowLoader(files, seq_len=40, n_max_sequences=50, seed=2, norm=norm, resident=True)
        for batch, at in ((1, 0), (1, 49), (37, 0), (37, 30)):
            cursor = EpochCursor(loader, batch)
            cursor.cursor.fill_(at)
            fused = loader.batch_at_cursor(cursor.cursor, batch)
            torch_gather = loader.batch_at(cursor.positions())
            for name, a in fused.__dict__.items():
                b = getattr(torch_gather, name)
                assert a.dtype == b.dtype and a.shape == b.shape, (kind, name, a.dtype, b.dtype, a.shape, b.shape)
                assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), (kind, name, batch, at, norm is None)
# one feature and one horizon (a single `--horizons`): the kernel's narrowest blocks
from alpha_core.data.window_gather import gather_windows
buf = {"features": torch.randn(300, 1).half(), "dt": torch.rand(300), "labels": torch.randn(300, 1).half(),
       "outcome_long": torch.randn(300, 1), "outcome_short": torch.randn(300, 1)}
first, mean, std = torch.randint(0, 260, (50,)), torch.randn(1), torch.rand(1) + 0.5
out = gather_windows(torch.tensor(45), 8, 40, first, first, first, buf, mean, std)
rows = first[(45 + torch.arange(8)).clamp(max=49)][:, None] + torch.arange(40)
assert torch.equal(out["x"], (buf["features"][rows].float() - mean) / std)
assert torch.equal(out["labels"], buf["labels"][rows].float()) and torch.equal(out["outcome_long"], buf["outcome_long"][rows])
print("ok")
"""


@pytest.mark.slow
def test_the_fused_gather_equals_the_torch_gather_in_the_triton_interpreter(tiny_sidecars):
    """What the CUDA graph's step gathers with one Triton kernel (`window_gather`) is bit for bit what the torch
    gather gives, for book and bars, normalised or not, at batch 1 and past the epoch's end (clamped), and with
    one feature and one horizon."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # read when the kernel is defined: a fresh interpreter
    paths = [",".join(str(sc.path) for sc in tiny_sidecars[kind][:2]) for kind in ("book", "bars")]
    done = subprocess.run([sys.executable, "-c", GATHER_CHECK, *paths], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]


def _truncated(sc: Sidecar, n: int) -> Sidecar:
    arrays = {k: np.asarray(getattr(sc, k))[:n] for k in ARRAYS}
    return Sidecar(path=sc.path, meta=sc.meta.model_copy(update={"rows": n}), **arrays)


def test_take_rows_reads_exactly_the_rows_asked(tiny_sidecars):
    """One pread per run of consecutive rows gives what indexing the array gives: runs, single rows, the last row,
    none; arrays held in memory are indexed."""
    from alpha_core.data.loader import take_rows

    sc = tiny_sidecars["book"][0]
    rng = np.random.default_rng(0)
    picks = [
        np.arange(10, 200),
        np.sort(rng.choice(sc.rows, 500, replace=False)),
        np.array([sc.rows - 1]),
        np.array([], dtype=np.int64),
        np.r_[0:5, 7, 9:12, sc.rows - 3 : sc.rows],
    ]
    for name in ("features", "dt", "labels", "ts", "instrument_id"):
        for rows in picks:
            got = take_rows(sc, name, rows)
            np.testing.assert_array_equal(got, np.asarray(getattr(sc, name))[rows])
            assert got.dtype == np.asarray(getattr(sc, name)).dtype
    cut = _truncated(sc, 300)
    np.testing.assert_array_equal(take_rows(cut, "labels", np.arange(250, 300)), np.asarray(sc.labels)[250:300])


@pytest.mark.parametrize("kind", ["book", "bars"])
def test_a_quarter_of_several_files_reads_as_one_without_copying_them(tiny_sidecars, kind):
    """A quarter split over files (a daily download) is read through its parts (`PartsSidecar`): every read, gather
    and whole array is the parts' concatenation, each later part's price shifted to go on where the previous one
    ended (no move at a file boundary), and a part's labels end with it (NaN past its last row)."""
    from alpha_core.data.loader import take_rows
    from alpha_core.data.sidecar import PartsSidecar, concat_sidecars, rows_between

    sc = tiny_sidecars[kind][1]
    ts = np.asarray(sc.ts)
    cut = len(ts) // 3
    parts = [rows_between(sc, int(ts[0]), int(ts[cut - 1])), rows_between(sc, int(ts[cut]), int(ts[-1]))]
    assert [p.rows for p in parts] == [cut, len(ts) - cut]
    assert np.isnan(np.asarray(parts[0].labels, dtype=np.float32)[-1]).all()  # the horizon would leave the part
    quarter = concat_sidecars(parts, "2024-Q2")
    assert isinstance(quarter, PartsSidecar) and quarter.meta.source.name == "2024-Q2" and quarter.rows == sc.rows
    price = np.asarray(sc.price).copy()
    price[cut:] += price[cut - 1] - price[cut]
    for name in ARRAYS:
        whole = np.concatenate([np.asarray(p.array(name)) for p in parts]) if name != "price" else price
        np.testing.assert_array_equal(np.asarray(quarter.array(name)), whole, err_msg=name)
        np.testing.assert_array_equal(quarter.read(name, cut - 5, cut + 7), whole[cut - 5 : cut + 7], err_msg=name)
        rows = np.array([0, 3, cut - 1, cut, cut + 2, sc.rows - 1])
        np.testing.assert_array_equal(take_rows(quarter, name, rows), whole[rows], err_msg=name)
    total, total_sq = quarter.feature_sums()
    np.testing.assert_allclose(total, np.asarray(sc.features, dtype=np.float64).sum(axis=0), rtol=1e-9)
    assert total_sq.shape == total.shape
