"""Sidecar cache: built on a miss, reused on a hit, rebuilt when corrupt or stale, never half-written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from alpha_core.data.sidecar import LabelConfig, ensure_sidecar
from alpha_core.errors import DataError


@pytest.fixture
def book_file(tiny_data):
    return sorted((tiny_data / "ES.FUT" / "mbp-10").glob("*.dbn.zst"))[1]


def visible(directory):
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def test_miss_then_hit_returns_the_same_memory_mapped_arrays(tmp_path, book_file):
    first, status = ensure_sidecar(book_file, tmp_path)
    assert status == "built"
    again, status = ensure_sidecar(book_file, tmp_path)
    assert status == "reused" and again.path == first.path
    assert isinstance(again.features, np.memmap) and not again.features.flags.writeable
    np.testing.assert_array_equal(again.features, first.features)
    assert visible(tmp_path) == [first.path.name]


@pytest.mark.parametrize("damage", ["meta", "array", "truncate"])
def test_corrupt_sidecar_is_detected_and_rebuilt(tmp_path, book_file, damage):
    sc, _ = ensure_sidecar(book_file, tmp_path)
    reference = np.array(sc.labels)
    if damage == "meta":
        (sc.path / "meta.json").write_text("{not json")
    elif damage == "array":
        (sc.path / "labels.npy").unlink()
    else:
        data = (sc.path / "features.npy").read_bytes()
        (sc.path / "features.npy").write_bytes(data[: len(data) // 2])
    rebuilt, status = ensure_sidecar(book_file, tmp_path)
    assert status == "rebuilt"
    np.testing.assert_array_equal(rebuilt.labels, reference)
    assert visible(tmp_path) == [sc.path.name]


def test_meta_with_unknown_keys_is_corrupt(tmp_path, book_file):
    sc, _ = ensure_sidecar(book_file, tmp_path)
    meta = json.loads((sc.path / "meta.json").read_text())
    meta["surprise"] = 1
    (sc.path / "meta.json").write_text(json.dumps(meta))
    assert ensure_sidecar(book_file, tmp_path)[1] == "rebuilt"


def test_changed_label_settings_replace_the_stale_sidecar(tmp_path, book_file):
    old, _ = ensure_sidecar(book_file, tmp_path)
    old_long = np.array(old.outcome_long)
    new, status = ensure_sidecar(book_file, tmp_path, label_config=LabelConfig(outcome_label_cost=1.0))
    assert status == "rebuilt" and new.path != old.path
    assert visible(tmp_path) == [new.path.name]
    assert new.meta.outcome_label_cost == 1.0
    np.testing.assert_allclose(new.outcome_long + 1.0, old_long + 0.5, atol=1e-4)
    with pytest.raises(DataError, match=r"outcome_long.npy is gone: the sidecar was removed while in use"):
        _ = old.outcome_long  # arrays are mapped on use: an evicted sidecar is a clear error, not a traceback


def test_changed_source_file_gets_a_new_sidecar(tmp_path, book_file, tiny_data):
    work = tmp_path / "data"
    work.mkdir()
    target = work / book_file.name
    target.write_bytes(book_file.read_bytes())
    first, _ = ensure_sidecar(target, tmp_path / "pd")
    other = sorted((tiny_data / "ES.FUT" / "mbp-10").glob("*.dbn.zst"))[2]
    target.write_bytes(other.read_bytes())  # same name, new content
    second, status = ensure_sidecar(target, tmp_path / "pd")
    assert status == "rebuilt" and second.meta.source.sha256 != first.meta.source.sha256
    assert visible(tmp_path / "pd") == [second.path.name]


BUILD = """
import sys
from alpha_core.data.sidecar import ensure_sidecar
ensure_sidecar(sys.argv[1], sys.argv[2])
"""


def test_killed_build_leaves_no_half_sidecar(tmp_path):
    """Kill the builder while it writes its arrays: no sidecar appears, and the next build recovers."""
    from alpha_core.data.demo import generate_demo_data

    generate_demo_data(tmp_path / "data", "small", seed=3, symbols=["ES.FUT"], quarters=1)
    source = next((tmp_path / "data" / "ES.FUT" / "mbp-10").glob("*.dbn.zst"))
    cache = tmp_path / "pd"
    proc = subprocess.Popen([sys.executable, "-c", BUILD, str(source), str(cache)])
    deadline = time.monotonic() + 60
    while not (list(cache.glob(".*.tmp~*/*.npy")) if cache.exists() else []):
        assert proc.poll() is None, "the build finished before it could be killed mid-write"
        assert time.monotonic() < deadline
        time.sleep(0.0005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert visible(cache) == [], "a killed build must not leave a sidecar"
    assert list(cache.glob(".*.tmp~*")), "the killed writer's temporary should still be there"

    sc, status = ensure_sidecar(source, cache)
    assert status == "built"
    assert sorted(p.name for p in cache.iterdir()) == [sc.path.name]  # dead temporary cleaned up


def test_a_failed_background_flush_fails_the_build_and_leaves_no_sidecar(tmp_path, book_file, monkeypatch):
    """The arrays go to disk while they are written (`build.WriteBack`): an error there (a full or failing
    disk) is the build's error, never swallowed by the background thread, and no sidecar appears."""
    import errno

    from alpha_core.data import build

    def fail(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(build, "WRITEBACK_BYTES", 1)  # flush after every write
    monkeypatch.setattr(os, "fdatasync", fail)
    with pytest.raises(DataError, match=r"cannot write the sidecar of .*: no space left on device"):
        ensure_sidecar(book_file, tmp_path / "pd")
    assert visible(tmp_path / "pd") == []
    monkeypatch.undo()
    sc, status = ensure_sidecar(book_file, tmp_path / "pd")
    assert status == "built" and visible(tmp_path / "pd") == [sc.path.name]
