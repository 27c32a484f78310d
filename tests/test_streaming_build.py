"""Streaming sidecar builds: the arrays do not depend on how the file is cut into chunks, memory does not grow with
the file, and the book's close-trade clock (`trade_ts`) matches the OHLCV-1m bars of the same trades."""

from __future__ import annotations

import tracemalloc

import databento as db
import numpy as np
import pytest
import zstandard

from alpha_core.data import features, series
from alpha_core.data.build import build_arrays
from alpha_core.data.dbn import read_info
from alpha_core.data.demo import DemoScale, _write_quarter
from alpha_core.data.products import product
from alpha_core.data.sidecar import ARRAYS, ensure_sidecar
from alpha_core.sessions import session_days

NS_MIN = 60_000_000_000
ES = product("ES.FUT")
ROLLING = ("return_5", "return_15", "realized_vol_30", "volume_z_60")  # polars' compensated rolling sums


def _arrays(sc) -> dict[str, np.ndarray]:
    out = {name: np.array(getattr(sc, name)) for name in ARRAYS}
    out["meta"] = sc.meta.model_dump(include={"rows", "contracts", "roll_dates", "dropped", "first_ts", "last_ts"})
    return out


@pytest.fixture(scope="module")
def holed_book(tiny_data, tmp_path_factory):
    """A tiny MBP-10 file where some snapshots have an empty bid side (dropped rows whose trades move on)."""
    src = sorted((tiny_data / "ES.FUT" / "mbp-10").glob("*.dbn.zst"))[0]
    raw = zstandard.ZstdDecompressor().stream_reader(src.open("rb")).read()
    records = db.DBNStore.from_file(src).to_ndarray().copy()
    snaps = np.flatnonzero(records["flags"] & 128)
    empty = snaps[np.random.default_rng(3).random(len(snaps)) < 0.05]
    records["bid_px_00"][empty] = np.iinfo(np.int64).max  # UNDEF_PRICE: no bid
    records["bid_sz_00"][empty] = 0
    records["bid_ct_00"][empty] = 0
    out = tmp_path_factory.mktemp("holed") / "ES.FUT_holed.dbn.zst"
    out.write_bytes(
        zstandard.ZstdCompressor(level=3).compress(raw[: 8 + int.from_bytes(raw[4:8], "little")] + records.tobytes())
    )
    return out


def test_dropped_snapshots_match_the_reference(holed_book, tmp_path):
    """Snapshots without a bid are dropped and their trades counted at the next snapshot, as the per-record
    reference does it."""
    from test_features_reference import reference_book

    sc, _ = ensure_sidecar(holed_book, tmp_path)
    rows, labels, long_ = reference_book(holed_book, ES.tick_size, sc.meta.horizons, sc.meta.outcome_label_cost)
    assert sc.rows == len(rows) and sc.meta.dropped["snapshots_without_valid_top_of_book"] > 10
    np.testing.assert_array_equal(sc.ts, [r[0] for r in rows])
    np.testing.assert_array_equal(sc.trade_ts, [r[3] for r in rows])
    # stored as float16: within its rounding (2^-11 relative) of the reference
    np.testing.assert_allclose(sc.features, np.array([r[2] for r in rows]), rtol=5e-4, atol=1e-5)
    np.testing.assert_array_equal(np.nan_to_num(sc.labels, nan=-1), np.nan_to_num(labels, nan=-1))
    np.testing.assert_allclose(sc.outcome_long, long_, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("records", [3, 1000])
def test_book_arrays_do_not_depend_on_the_chunking(holed_book, tmp_path, monkeypatch, records):
    whole = _arrays(ensure_sidecar(holed_book, tmp_path / "whole")[0])  # the tiny file is one decoded chunk
    assert whole["meta"]["dropped"]["snapshots_without_valid_top_of_book"] > 10
    monkeypatch.setattr(series, "BOOK_CHUNK_RECORDS", records)
    monkeypatch.setattr(features, "BOOK_BLOCK_ROWS", 5)
    chunked = _arrays(ensure_sidecar(holed_book, tmp_path / "chunked")[0])
    assert chunked["meta"] == whole["meta"]
    for name in ARRAYS:
        np.testing.assert_array_equal(chunked[name], whole[name], err_msg=name)


def test_bar_arrays_do_not_depend_on_the_chunking(tiny_data, tmp_path, monkeypatch):
    path = sorted((tiny_data / "ES.FUT" / "ohlcv-1m").glob("*.dbn.zst"))[0]
    whole_sc, _ = ensure_sidecar(path, tmp_path / "whole")
    whole = _arrays(whole_sc)
    monkeypatch.setattr(series, "BAR_CHUNK_RECORDS", 7)
    monkeypatch.setattr(series, "BAR_BLOCK_ROWS", 50)
    chunked = _arrays(ensure_sidecar(path, tmp_path / "chunked")[0])
    assert chunked["meta"] == whole["meta"] and whole["meta"]["rows"] > 500
    for name in ARRAYS:
        if name != "features":
            np.testing.assert_array_equal(chunked[name], whole[name], err_msg=name)
    rolling = [whole_sc.meta.feature_names.index(n) for n in ROLLING]
    exact = [i for i in range(len(whole_sc.meta.feature_names)) if i not in rolling]
    np.testing.assert_array_equal(chunked["features"][:, exact], whole["features"][:, exact])
    np.testing.assert_allclose(chunked["features"][:, rolling], whole["features"][:, rolling], rtol=1e-5, atol=1e-7)


def _peak_build_bytes(path, out, kind: str) -> int:
    """Peak traced (Python and numpy) memory of writing the sidecar arrays of `path`."""
    out.mkdir()
    info = read_info(path)
    tracemalloc.start()
    try:
        built = build_arrays(out, info, kind, ES, (10, 100, 1000) if kind == "book" else (5, 15, 60), 0.5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert built.rows == np.load(out / "ts.npy", mmap_mode="r").shape[0]
    return peak, built.rows


@pytest.mark.parametrize("kind", ["book", "bars"])
def test_build_memory_does_not_grow_with_the_file(tmp_path, monkeypatch, kind):
    """A file with 12x the sessions needs no more memory: only a chunk and the carried tails are held."""
    monkeypatch.setattr(series, "BOOK_CHUNK_RECORDS", 256)
    monkeypatch.setattr(series, "BAR_CHUNK_RECORDS", 64)
    monkeypatch.setattr(series, "BAR_BLOCK_ROWS", 64)
    schema = "mbp-10" if kind == "book" else "ohlcv-1m"
    paths = {}
    for sessions in (3, 36):
        data = tmp_path / f"data-{sessions}"
        _write_quarter(data, ES, 2024, 1, DemoScale("test", 1, sessions, 1_500), seed=11)
        paths[sessions] = next((data / "ES.FUT" / schema).glob("*.dbn.zst"))
    _peak_build_bytes(paths[3], tmp_path / "warm-up", kind)  # first-use allocations (caches) are not the file's
    peaks = {n: _peak_build_bytes(path, tmp_path / f"out-{n}", kind) for n, path in paths.items()}
    (short_peak, short_rows), (long_peak, long_rows) = peaks[3], peaks[36]
    assert long_rows > 10 * short_rows
    # a few hundred KB of the peak vary from run to run (buffers at chunk boundaries); holding the arrays grew by
    # over 100 B a row
    assert long_peak - short_peak < 16 * (long_rows - short_rows), peaks


def test_close_trade_clock_matches_the_bars(tiny_data, tmp_path):
    """Minutes with a front-month trade (from the book's `trade_ts`) are exactly the minutes with a bar of that
    contract, and each minute's last trade is the bar's close."""
    for quarter in (0, 2):
        mbp = sorted((tiny_data / "ES.FUT" / "mbp-10").glob("*.dbn.zst"))[quarter]
        bars_path = sorted((tiny_data / "ES.FUT" / "ohlcv-1m").glob("*.dbn.zst"))[quarter]
        sc, _ = ensure_sidecar(mbp, tmp_path)
        trade_ts, ts, iid = np.asarray(sc.trade_ts), np.asarray(sc.ts), np.asarray(sc.instrument_id)
        assert trade_ts[0] == -1 or trade_ts[0] <= ts[0]
        assert (trade_ts <= ts).all()  # the latest trade received by this snapshot

        # the close trade of minute m: the latest trade_ts in [m, m + 60 s), and the contract of its snapshot
        has = trade_ts >= 0
        minute = trade_ts[has] // NS_MIN * NS_MIN
        close_ts = {}
        for m, t, i in zip(minute.tolist(), trade_ts[has].tolist(), iid[has].tolist(), strict=True):
            if t > close_ts.get(m, (-1, 0))[0]:
                close_ts[m] = (t, i)

        records = db.DBNStore.from_file(mbp).to_ndarray()
        trades = records[records["action"] == b"T"]
        price_of = {
            (int(t), int(i)): int(p)
            for t, i, p in zip(trades["ts_event"], trades["instrument_id"], trades["price"], strict=True)
        }
        bars = db.DBNStore.from_file(bars_path).to_ndarray()
        close_of = {
            (int(t), int(i)): int(c) for t, i, c in zip(bars["ts_event"], bars["instrument_id"], bars["close"], strict=True)
        }
        for m, (t, i) in close_ts.items():
            assert close_of[(m, i)] == price_of[(t, i)], (m, t, i)

        # the converse: every bar of the book's front contract (per session) after its first trade has a close trade
        front = dict(zip(session_days(ts).tolist(), iid.tolist(), strict=False))
        bar_days = session_days(bars["ts_event"].astype(np.int64))
        first = min(close_ts)
        expected = {
            int(t)
            for t, i, d in zip(bars["ts_event"], bars["instrument_id"], bar_days, strict=True)
            if front.get(int(d)) == int(i) and int(t) >= first and int(t) <= ts[-1]
        }
        assert expected == set(close_ts)
        assert len(expected) > 100


# --- the integrity checks stream too (issue 23 item 4) --------------------------------------------------------------


def _peak_check_bytes(sc) -> tuple[int, list[str]]:
    from alpha_core.data.checks import sidecar_problems

    tracemalloc.start()
    try:
        problems = sidecar_problems(sc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, problems


@pytest.mark.parametrize("kind", ["book", "bars"])
def test_check_memory_does_not_grow_with_the_file(tmp_path, monkeypatch, kind):
    """Checking a sidecar with 12x the rows takes no more memory: blocks of rows are read and let go (the checks
    held whole arrays and per-row temporaries, 22 B a row: over 100 KiB more here)."""
    from alpha_core.data import checks

    monkeypatch.setattr(checks, "BLOCK_ROWS", 128)
    schema = "mbp-10" if kind == "book" else "ohlcv-1m"
    sidecars = {}
    for sessions in (3, 36):
        data = tmp_path / f"data-{sessions}"
        _write_quarter(data, ES, 2024, 1, DemoScale("test", 1, sessions, 1_500), seed=11)
        sidecars[sessions], _ = ensure_sidecar(next((data / "ES.FUT" / schema).glob("*.dbn.zst")), tmp_path / "pd")
        _peak_check_bytes(sidecars[sessions])  # once before measuring: first-use allocations are not the file's
    peaks = {}
    for sessions, sc in sidecars.items():
        peak, problems = _peak_check_bytes(sc)
        assert problems == []
        peaks[sessions] = (peak, sc.rows)
    (short_peak, short_rows), (long_peak, long_rows) = peaks[3], peaks[36]
    assert long_rows > 10 * short_rows
    assert long_peak < 1.3 * short_peak + 16_384, peaks


def test_check_findings_do_not_depend_on_the_block_size(tiny_data, tmp_path, monkeypatch):
    """A bar sidecar with a low above its high, a 20% jump and a made-up label, each at its own row: every block
    size finds each at the same row (what a block needs from the one before is carried)."""
    import shutil

    from alpha_core.data import checks
    from alpha_core.data.sidecar import load_sidecar

    built, _ = ensure_sidecar(sorted((tiny_data / "ES.FUT" / "ohlcv-1m").glob("*.dbn.zst"))[1], tmp_path / "pd")
    odd = tmp_path / "odd" / built.path.name
    shutil.copytree(built.path, odd)
    col = built.meta.feature_names.index("log_range")
    features = np.load(odd / "features.npy", mmap_mode="r+")
    features[77, col] = -0.5
    price = np.load(odd / "price.npy", mmap_mode="r+")
    price[500:] *= 1.2
    labels = np.load(odd / "labels.npy", mmap_mode="r+")
    labels[-1, 0] = 1.0  # the last row has no price at its horizon: its label must be NaN
    del features, price, labels
    sc = load_sidecar(odd)
    found = {}
    for block in (7, 500, 1 << 17):
        monkeypatch.setattr(checks, "BLOCK_ROWS", block)
        found[block] = checks.sidecar_problems(sc)
    assert found[7] == found[500] == found[1 << 17], found
    text = "\n".join(found[7])
    assert "1 rows with a crossed/locked book or low > high" in text
    assert "price jumps 20.0% at row 500" in text
    assert f"labels NaN pattern wrong at row {sc.rows - 1}, horizon 5" in text
