"""Compact book sidecars (issue 23 item 3): features and labels stored as float16, exactly the float32 values the
build computes cast down, saturating instead of overflowing; readers compute in float32; a book row is 176 bytes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from alpha_core.data import labels as lbl
from alpha_core.data.build import FLOAT16_MAX, NpyAppender, stored_form
from alpha_core.data.dbn import read_info
from alpha_core.data.features import BookFeatures
from alpha_core.data.loader import EpochCursor, WindowLoader
from alpha_core.data.norm import fit_norm_stats
from alpha_core.data.products import product
from alpha_core.data.series import read_book
from alpha_core.data.sidecar import STORED_DTYPES, SidecarCorrupt, ensure_sidecar, load_sidecar

ES = product("ES.FUT")


def _row_bytes(sc) -> int:
    """Bytes a row takes on disk: itemsize x row width, summed over the arrays of its meta."""
    return sum(np.dtype(s.dtype).itemsize * int(np.prod(s.shape[1:], dtype=np.int64)) for s in sc.meta.arrays.values())


def test_book_sidecar_stores_the_float32_build_cast_to_float16(tiny_data, tmp_path):
    path = sorted((tiny_data / "ES.FUT" / "mbp-10").glob("*.dbn.zst"))[0]
    sc, _ = ensure_sidecar(path, tmp_path)
    # the build's float32 computation, on the same chunks
    feats = BookFeatures(ES.tick_size)
    stream = lbl.LabelStream(lbl.SNAPSHOTS, tuple(sc.meta.horizons), feats.price_scale, sc.meta.outcome_label_cost)
    values, direction = [], []
    for chunk in read_book(read_info(path), ES.root).chunks():
        f = feats(chunk)
        values.append(f.values)
        direction.append(stream.push(f.price_fixed, f.ts).direction)
    direction.append(stream.finish().direction)
    values, direction = np.concatenate(values), np.concatenate(direction)
    assert values.dtype == direction.dtype == np.float32 and len(values) == sc.rows
    assert np.abs(values).max() < FLOAT16_MAX  # demo values: the plain cast is the stored form
    assert sc.features.dtype == sc.labels.dtype == np.float16
    np.testing.assert_array_equal(sc.features, values.astype(np.float16))
    # labels are 0, 1 or NaN: float16 holds each exactly, so they equal the float32 labels (NaN where NaN)
    assert set(np.unique(direction[np.isfinite(direction)]).tolist()) == {0.0, 1.0} and np.isnan(direction).any()
    np.testing.assert_array_equal(sc.labels.astype(np.float32), direction)
    # what float16 costs the features: a relative rounding of at most 2^-11 (finite, no value pushed to 0 or inf)
    stored = np.asarray(sc.features, dtype=np.float32)
    assert np.isfinite(stored).all()
    assert (np.abs(stored - values) <= 2**-11 * np.abs(values) + 2**-25).all()


def test_float16_cast_saturates_instead_of_overflowing(tmp_path):
    rows = np.array([[1e6, -1e6, 65504.0, 65520.0, -7e4], [np.nan, 1.5, 0.0, 1.0, -2.25]], dtype=np.float32)
    want = np.array([[65504, -65504, 65504, 65504, -65504], [np.nan, 1.5, 0, 1, -2.25]], dtype=np.float16)
    with np.errstate(over="ignore"):
        assert np.isinf(rows.astype(np.float16)).sum() == 4  # what a plain cast would store
    np.testing.assert_array_equal(stored_form(rows, np.dtype(np.float16)), want)
    # and the appender, which every array of a sidecar is written through
    with open(tmp_path / "x.npy", "wb") as fh:
        NpyAppender(fh, tmp_path / "x.npy", np.float16, rows.shape).write(rows)
    got = np.load(tmp_path / "x.npy")
    assert got.dtype == np.float16 and not np.isinf(got).any()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(stored_form(rows, np.dtype(np.float32)), rows)  # bars: unchanged


@pytest.mark.parametrize("resident", [False, True])
def test_loader_keeps_float16_and_yields_float32(tiny_sidecars, resident):
    train, val = tiny_sidecars["book"][:2], tiny_sidecars["book"][2]
    norm = fit_norm_stats(train)
    loader = WindowLoader([val], seq_len=16, n_max_sequences=64, seed=3, norm=norm, resident=resident)
    assert loader._buf["features"].dtype == loader._buf["labels"].dtype == torch.float16
    batch = EpochCursor(loader, 32).next_batch() if resident else loader.next_batch(32)
    assert batch.x.dtype == batch.labels.dtype == torch.float32
    mean, std = norm.arrays()
    raw = np.stack([np.asarray(val.features[s : s + 16], dtype=np.float32) for s in batch.start.tolist()])
    np.testing.assert_array_equal(batch.x.numpy(), (raw - mean) / std)
    labels = np.stack([val.labels[s : s + 16] for s in batch.start.tolist()]).astype(np.float32)
    np.testing.assert_array_equal(batch.labels.numpy(), labels)
    bare = WindowLoader([val], seq_len=16, n_max_sequences=64, seed=3).next_batch(32)  # no norm stats
    assert bare.x.dtype == torch.float32
    np.testing.assert_array_equal(bare.x.numpy(), np.stack([val.features[s : s + 16] for s in bare.start.tolist()]))


def test_a_book_row_is_176_bytes_and_stays_so(tiny_sidecars, tmp_path):
    book, bars = tiny_sidecars["book"][0], tiny_sidecars["bars"][0]
    assert len(book.meta.feature_names) == 57 and len(book.meta.horizons) == 3
    # features 57 x 2 + ts 8 + price 8 + dt 4 + trade_ts 8 + labels 3 x 2 + outcomes 2 x 3 x 4 + instrument_id 4
    assert _row_bytes(book) == 176
    assert {n: s.dtype for n, s in book.meta.arrays.items()} == {n: d.name for n, d in STORED_DTYPES["book"].items()}
    assert bars.features.dtype == bars.labels.dtype == np.float32  # bar features keep float32's precision
    # a book sidecar stored wide is not one of ours: load refuses it (and the cache rebuilds it)
    wide = tmp_path / book.path.name
    shutil.copytree(book.path, wide)
    np.save(wide / "features.npy", np.asarray(book.features, dtype=np.float32))
    meta = json.loads((wide / "meta.json").read_text())
    meta["arrays"]["features"]["dtype"] = "float32"
    (wide / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SidecarCorrupt, match="features.npy is float32, a book sidecar stores float16"):
        load_sidecar(wide)


def test_the_meta_s_feature_sums_are_those_of_the_stored_values(tiny_sidecars):
    """The build records each feature's sum and sum of squares over the stored rows (normalisation reads them,
    not the rows): they are the sums of what a reader gets."""
    for sc in [*tiny_sidecars["book"], *tiny_sidecars["bars"]]:
        wide = np.asarray(sc.features, dtype=np.float64)
        total, total_sq = sc.feature_sums()
        np.testing.assert_allclose(total, wide.sum(axis=0), rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(total_sq, np.square(wide).sum(axis=0), rtol=1e-12, atol=1e-9)
