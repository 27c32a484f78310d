"""Sidecar cache: built on a miss, reused on a hit, rebuilt when corrupt or stale, never half-written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from alpha_core.data.sidecar import LabelConfig, ensure_sidecar, load_sidecar
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


# --- one open file, and reuse without a hash (issue 20 item 2, issue 23 item 4) ----------------------------------


def _records(path):
    import databento as db
    import zstandard

    raw = zstandard.ZstdDecompressor().stream_reader(path.open("rb")).read()
    return raw[: 8 + int.from_bytes(raw[4:8], "little")], db.DBNStore.from_file(path).to_ndarray().copy()


def test_a_file_replaced_during_the_build_never_lands_under_another_key(tmp_path, tiny_data, monkeypatch):
    """A downloader renames a corrected file (one book size differs) over the path after the build opened and
    hashed it: the sidecar holds the rows of the bytes its key hashes, so a later run of that content reuses the
    right rows (the build used to reopen the path and store the other file's rows under the first one's key)."""
    import zstandard

    from alpha_core.data import build

    source = sorted((tiny_data / "ES.FUT" / "mbp-10").glob("*.dbn.zst"))[1]
    work = tmp_path / "data"
    work.mkdir()
    target = work / source.name
    shutil.copy(source, target)
    head, r = _records(source)
    i = int(np.flatnonzero((r["flags"] & 128) != 0)[len(r) // 4])
    r["bid_sz_00"][i] += 7
    corrected = zstandard.ZstdCompressor(level=3).compress(head + r.tobytes())
    build_arrays = build.build_arrays

    def replaced_meanwhile(*args, **kwargs):
        incoming = work / ".incoming"
        incoming.write_bytes(corrected)
        os.replace(incoming, target)
        return build_arrays(*args, **kwargs)

    monkeypatch.setattr(build, "build_arrays", replaced_meanwhile)
    first, status = ensure_sidecar(target, tmp_path / "pd")
    monkeypatch.undo()
    reference, _ = ensure_sidecar(source, tmp_path / "reference")
    assert status == "built" and first.meta.source.sha256 == reference.meta.source.sha256
    shutil.copy(source, target)  # the first content again
    again, status = ensure_sidecar(target, tmp_path / "pd")
    assert status == "reused" and again.path == first.path
    np.testing.assert_array_equal(again.features, reference.features)


def test_a_file_rewritten_in_place_between_the_passes_fails_the_build(tmp_path, tiny_data, monkeypatch):
    """Between the build's two passes the file is rewritten in place (same inode, same rows, one book size
    changed): the second pass decodes bytes of another hash, so the build fails and leaves nothing."""
    import zstandard

    from alpha_core.data import build

    source = sorted((tiny_data / "ES.FUT" / "mbp-10").glob("*.dbn.zst"))[1]
    target = tmp_path / source.name
    shutil.copy(source, target)
    head, r = _records(source)
    r["bid_sz_00"][len(r) // 2] += 1
    changed = zstandard.ZstdCompressor(level=3).compress(head + r.tobytes())
    read_book = build.read_book

    def rewritten_after_pass_1(info, root):
        first_pass = read_book(info, root)
        with target.open("r+b") as fh:
            fh.write(changed)
            fh.truncate()
        return first_pass

    monkeypatch.setattr(build, "read_book", rewritten_after_pass_1)
    with pytest.raises(DataError, match=rf"{target.name}: the file changed while its sidecar was built"):
        ensure_sidecar(target, tmp_path / "pd")
    assert visible(tmp_path / "pd") == []


def _bytes_read() -> int:
    """Bytes this process has read through read(2)/pread(2) so far, page cache hits included."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_an_unchanged_source_is_reused_without_reading_it(tmp_path):
    """Reuse reads the metadata and the sidecar's headers, not the whole source: the stat recorded in the meta
    (size, mtime, ctime, inode, device) still matches. Touched, the file is hashed once, and the new stat
    recorded; every step re-hashed every source before."""
    from alpha_core.data.demo import DemoScale, _write_quarter
    from alpha_core.data.products import product

    _write_quarter(tmp_path / "data", product("ES.FUT"), 2024, 1, DemoScale("test", 1, 4, 20_000), seed=5)
    path = next((tmp_path / "data" / "ES.FUT" / "mbp-10").glob("*.dbn.zst"))
    size = path.stat().st_size
    assert size > 2_000_000
    cache = tmp_path / "pd"
    assert ensure_sidecar(path, cache)[1] == "built"

    def reuse() -> int:
        before = _bytes_read()
        assert ensure_sidecar(path, cache)[1] == "reused"
        return _bytes_read() - before

    assert reuse() < size / 10
    os.utime(path)  # the same bytes, a new mtime and ctime: the hash decides, once
    assert reuse() >= size
    assert reuse() < size / 10
    assert ensure_sidecar(path, cache)[0].meta.source.mtime_ns == path.stat().st_mtime_ns


def _mapped(directory) -> list[str]:
    """Files under `directory` that this process has memory-mapped now."""
    root = str(directory)
    return sorted({line.split(maxsplit=5)[5] for line in Path("/proc/self/maps").read_text().splitlines() if root in line})


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc/self/maps")
def test_predecode_keeps_no_sidecar_mapped(tiny_data, tmp_path):
    """`alpha predecode` builds, reuses and checks every sidecar of a symbol: none stays mapped (each file's pages
    used to stay in the resident set to the end, 290 B a row). A caller that uses an array maps it, until it
    lets go of it."""
    from alpha_core.data.checks import sidecar_problems
    from alpha_core.data.predecode import predecode

    cache = tmp_path / "pd"
    for _ in range(2):
        items = predecode(tiny_data / "ES.FUT", cache, "ES.FUT", "mbp-10")
        assert all(sidecar_problems(i.sidecar) == [] for i in items)
        assert _mapped(cache) == []
    features = items[0].sidecar.features
    assert _mapped(cache) == [str(items[0].sidecar.path / "features.npy")]
    assert items[0].sidecar.features is features  # one mapping while it is held
    column = features[:, 0]
    del features
    assert len(_mapped(cache)) == 1  # a view holds its mapping
    del column
    assert _mapped(cache) == []


def test_threads_reading_sidecars_never_parse_two_headers_at_once(tiny_sidecars, monkeypatch):
    """numpy parses each .npy header with `ast`, which CPython 3.11 cannot do in two threads at once (a SystemError
    that failed a hyperopt run, whose particles train on threads): every header a sidecar reads is parsed alone."""
    import ast

    parse, active, most, count = ast.literal_eval, [0], [0], threading.Lock()

    def slow_parse(text):
        with count:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.005)  # wide enough that two unguarded parses always overlap
        try:
            return parse(text)
        finally:
            with count:
                active[0] -= 1

    monkeypatch.setattr(ast, "literal_eval", slow_parse)
    paths = [sc.path for sc in tiny_sidecars["bars"]]

    def read(path):
        sidecar = load_sidecar(path)  # verifies every array's header
        sidecar.array("close")  # maps one
        sidecar.read("close", 0, 4)  # reads one without mapping it

    threads = [threading.Thread(target=read, args=(path,)) for path in paths * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1, f"{most[0]} headers parsed at once"
