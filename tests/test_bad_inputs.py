"""Bad input fails with an error naming the file and what is wrong, and leaves no sidecar behind."""

from __future__ import annotations

import os
import shutil

import databento as db
import numpy as np
import pytest
import zstandard

from alpha_core.cli import main
from alpha_core.data.dbn import discover
from alpha_core.data.folds import plan_folds
from alpha_core.data.predecode import file_ref, predecode, symbol_dir
from alpha_core.data.sidecar import ensure_sidecar
from alpha_core.errors import DataError, PlanError


def assert_nothing_written(predecoded):
    assert not predecoded.exists() or list(predecoded.iterdir()) == []


@pytest.fixture
def book_file(tiny_data):
    return sorted((tiny_data / "ES.FUT" / "mbp-10").glob("*.dbn.zst"))[0]


def _rewrite(src, dst, mutate):
    """Decode `src`, let `mutate` change the records, and write a genuine DBN file to `dst`."""
    raw = zstandard.ZstdDecompressor().stream_reader(src.open("rb")).read()
    meta_len = 8 + int.from_bytes(raw[4:8], "little")
    records = db.DBNStore.from_file(src).to_ndarray().copy()
    records = mutate(records)
    dst.write_bytes(zstandard.ZstdCompressor(level=3).compress(raw[:meta_len] + records.tobytes()))
    return dst


def test_empty_file(tmp_path):
    bad = tmp_path / "ES.FUT_2024-Q1.dbn.zst"
    bad.write_bytes(b"")
    with pytest.raises(DataError, match=r"ES.FUT_2024-Q1.dbn.zst: file is empty"):
        ensure_sidecar(bad, tmp_path / "pd")
    assert_nothing_written(tmp_path / "pd")


def test_random_bytes(tmp_path):
    bad = tmp_path / "junk.dbn.zst"
    bad.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(DataError, match=r"junk.dbn.zst: not a valid DBN file: metadata header unreadable"):
        ensure_sidecar(bad, tmp_path / "pd")
    assert_nothing_written(tmp_path / "pd")


@pytest.mark.parametrize("keep", [0.999, 0.6, 0.2])
def test_truncated_zstd_stream(tmp_path, book_file, keep):
    data = book_file.read_bytes()
    cut = tmp_path / "cut.dbn.zst"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(DataError, match=r"cut.dbn.zst: (zstd stream is truncated|not a valid DBN file)"):
        ensure_sidecar(cut, tmp_path / "pd")
    assert_nothing_written(tmp_path / "pd")


@pytest.mark.filterwarnings("ignore:DBN file is truncated")
def test_truncated_uncompressed_file(tmp_path, book_file):
    raw = zstandard.ZstdDecompressor().stream_reader(book_file.open("rb")).read()
    cut = tmp_path / "cut.dbn"
    cut.write_bytes(raw[:-100])
    with pytest.raises(DataError, match=r"cut.dbn: file is truncated: \d+ bytes of an incomplete record"):
        ensure_sidecar(cut, tmp_path / "pd")
    assert_nothing_written(tmp_path / "pd")


def test_wrong_schema_where_book_is_expected(tmp_path, tiny_data):
    bars = sorted((tiny_data / "ES.FUT" / "ohlcv-1m").glob("*.dbn.zst"))[0]
    from alpha_core.data.dbn import read_info
    from alpha_core.data.series import read_book

    with pytest.raises(DataError, match=rf"{bars.name}: metadata.schema is 'ohlcv-1m'; expected mbp-10"):
        read_book(read_info(bars), "ES")


def test_timestamps_going_backwards(tmp_path, book_file):
    def swap(records):
        ts = records["ts_recv"].copy()
        ts[100], ts[101] = ts[101], ts[100]
        records["ts_recv"] = ts
        return records

    bad = _rewrite(book_file, tmp_path / "backwards.dbn.zst", swap)
    with pytest.raises(DataError, match=r"backwards.dbn.zst: record 101: ts_recv goes backwards"):
        ensure_sidecar(bad, tmp_path / "pd")
    assert_nothing_written(tmp_path / "pd")


def test_directory_without_dbn_files(tmp_path):
    (tmp_path / "notes.txt").write_text("no data here")
    with pytest.raises(DataError, match=rf"{tmp_path}: no DBN files"):
        discover(tmp_path)
    with pytest.raises(DataError, match=rf"{tmp_path}: no mbp-10 DBN files"):
        predecode(tmp_path, tmp_path / "pd", schema="mbp-10")
    assert_nothing_written(tmp_path / "pd")


def test_missing_directory(tmp_path):
    with pytest.raises(DataError, match=r"nowhere: data directory does not exist"):
        discover(tmp_path / "nowhere")


def test_unsupported_file_in_a_data_directory_is_named(tmp_path, book_file, samples):
    shutil.copy(book_file, tmp_path / book_file.name)
    shutil.copy(samples / "databento-python/GLBX.MDP3/test_data.trades.dbn.zst", tmp_path / "stray.dbn.zst")
    with pytest.raises(DataError, match=r"stray.dbn.zst: metadata.schema is 'trades'"):
        predecode(tmp_path, tmp_path / "pd")


def test_too_few_files_for_the_requested_folds(tiny_sidecars):
    refs = [file_ref(sc) for sc in tiny_sidecars["book"]]
    with pytest.raises(PlanError, match=r"CV layout overflows: cv_fold=3 \+ window=2 \+ 1 val quarter > 5 quarters"):
        plan_folds(refs, cv_n_folds=4, cv_train_window=2)


def test_unknown_symbol(tmp_path, book_file, tiny_data):
    with pytest.raises(PlanError, match=r"unknown symbol 'CL.FUT'; known symbols: ES.FUT, NQ.FUT, ZN.FUT, 6E.FUT"):
        ensure_sidecar(book_file, tmp_path / "pd", symbol="CL.FUT")
    with pytest.raises(DataError, match=r"ZN.FUT: no data directory for ZN.FUT \(symbols present: \['ES.FUT', 'NQ.FUT'\]"):
        symbol_dir(tiny_data, "ZN.FUT")
    assert_nothing_written(tmp_path / "pd")


def test_cli_reports_bad_input_without_traceback(tmp_path, capsys):
    bad = tmp_path / "junk.dbn"
    bad.write_bytes(os.urandom(64))
    assert main(["predecode", "--data-dir", str(tmp_path), "--predecoded-dir", str(tmp_path / "pd")]) == 2
    err = capsys.readouterr().err
    assert "alpha predecode: error:" in err and "junk.dbn: not a valid DBN file" in err
    assert "Traceback" not in err
