"""Window loader contract (the spec's MultiHorizonLoader) and normalisation statistics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from alpha_core.data.loader import WindowLoader
from alpha_core.data.norm import NormStats, fit_norm_stats
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
    `reset` reshuffled the order in the same buffers the graph keeps reading."""
    files = tiny_sidecars["book"][:2]
    loader = WindowLoader(files, seq_len=32, n_max_sequences=200, seed=3, norm=fit_norm_stats(files), resident=True)
    buffers = (loader._global_device.data_ptr(), loader._order_device.data_ptr())
    for epoch_seed in (3, 4):
        loader.reset(epoch_seed)
        expected = list(loader.batches(64, drop_last=True))
        cursor = torch.zeros((), dtype=torch.long)
        for batch in expected:
            got = loader.batch_at(cursor + torch.arange(64))
            cursor += 64
            for name in ("x", "dt", "labels", "outcome_long", "outcome_short", "file_index", "start"):
                torch.testing.assert_close(getattr(got, name), getattr(batch, name), equal_nan=True)
    assert (loader._global_device.data_ptr(), loader._order_device.data_ptr()) == buffers
