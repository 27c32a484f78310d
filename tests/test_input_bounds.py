"""Input bombs are bounded before they are trusted: a metadata length, the metadata's own counts, a decompression
ratio, a record count and a sidecar size beyond their limits (`alpha_core.bounds`) fail with one line naming the
file and the field, before anything is allocated from them; nothing reaches `databento_dbn`'s Rust decoder that
can make it panic or abort. The hostile files are crafted here, byte by byte."""

from __future__ import annotations

import json
import resource
import struct
import subprocess
import sys
from pathlib import Path

import databento as db
import numpy as np
import pytest
import zstandard

from alpha_core.cli import main
from alpha_core.data.sidecar import ensure_sidecar
from alpha_core.errors import DataError, PlanError

ZSTD_MAGIC = struct.pack("<I", 0xFD2FB528)
MAX_BLOCK = 1 << 17  # zstd's largest block: 128 KiB


def _block(last: bool, kind: int, size: int) -> bytes:
    return struct.pack("<I", int(last) | kind << 1 | size << 3)[:3]


def zeros_frame(prefix: bytes, zeros: int) -> bytes:
    """One zstd frame: `prefix` as a raw block, then `zeros` zero bytes as RLE blocks (4 bytes per 128 KiB):
    4 GiB of zeros in 128 KiB, as zstd itself would never write them but every decoder reads them."""
    sizes = [MAX_BLOCK] * (zeros // MAX_BLOCK) + ([zeros % MAX_BLOCK] if zeros % MAX_BLOCK else [])
    out = bytearray(ZSTD_MAGIC + bytes([0x00, (17 - 10) << 3]))  # no content size, a 128 KiB window
    out += _block(not sizes, 0, len(prefix)) + prefix
    for k, size in enumerate(sizes):
        out += _block(k == len(sizes) - 1, 1, size) + b"\x00"
    return bytes(out)


def book_file(tiny_data: Path, quarter: int = 2) -> Path:
    return tiny_data / "ES.FUT" / "mbp-10" / f"ES.FUT_2024-Q{quarter}.dbn.zst"


def header_and_records(path: Path) -> tuple[bytes, np.ndarray]:
    raw = zstandard.ZstdDecompressor().stream_reader(path.open("rb")).read()
    return raw[: 8 + int.from_bytes(raw[4:8], "little")], db.DBNStore.from_file(path).to_ndarray()


def run_alpha(*argv: str, memory_limit: int | None = None) -> subprocess.CompletedProcess:
    """`alpha ARGV` in a fresh process, its address space capped at `memory_limit` bytes: a reader that allocates
    what a header declares fails there instead of taking the machine's memory."""

    def cap() -> None:
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    script = "import sys; from alpha_core.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=cap,
        env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"},
    )


def one_line(done: subprocess.CompletedProcess, path: Path, *needles: str, code: int = 2) -> None:
    """One line on stderr naming `path` and every needle, exit `code` (2: bad input)."""
    assert done.returncode == code, (done.returncode, done.stderr[-3000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert path.name in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("packing", ["zstd", "sparse"])
def test_a_huge_metadata_length_is_refused_before_anything_is_read(tmp_path, packing):
    """A 128 KB zstd file (or a sparse plain one) whose header declares 4 GiB of metadata: refused from its first
    8 bytes, in a process capped at 2 GiB (it took 12.1 GB of RSS before its error)."""
    head = b"DBN\x03" + struct.pack("<I", 0xFFFFFFF0)
    if packing == "zstd":
        bomb = tmp_path / "ES.FUT" / "ES.FUT_2024-Q1.dbn.zst"
        bomb.parent.mkdir()
        bomb.write_bytes(zeros_frame(head, 1 << 32))
        assert bomb.stat().st_size < 140_000
    else:
        bomb = tmp_path / "ES.FUT" / "ES.FUT_2024-Q1.dbn"
        bomb.parent.mkdir()
        with bomb.open("wb") as fh:
            fh.write(head)
            fh.truncate(8 + (1 << 32))
    needles = ("metadata length is 4,294,967,280 bytes", "ALPHA_MAX_METADATA_BYTES")
    one_line(run_alpha("inspect", str(bomb), memory_limit=2 << 30), bomb, *needles)
    cache = tmp_path / "pd"
    one_line(
        run_alpha("predecode", "--data-dir", str(tmp_path), "--output-dir", str(cache), memory_limit=2 << 30), bomb, *needles
    )
    assert not cache.exists() or not any(cache.rglob("*"))


def _metadata(version: int) -> bytes:
    import datetime as dt
    from dataclasses import dataclass

    import databento_dbn as dbn

    @dataclass
    class Interval:
        start_date: dt.date
        end_date: dt.date
        symbol: str

    @dataclass
    class Mapping:
        raw_symbol: str
        intervals: list

    days = [dt.date(2024, 3, d) for d in (1, 2, 3)]
    return bytes(
        dbn.Metadata(
            dataset="GLBX.MDP3",
            schema=dbn.Schema.MBP_10,
            start=1_709_251_200_000_000_000,
            end=1_709_424_000_000_000_000,
            stype_in=dbn.SType.PARENT,
            stype_out=dbn.SType.INSTRUMENT_ID,
            symbols=["ES.FUT"],
            partial=[],
            not_found=[],
            mappings=[
                Mapping("ESH4", [Interval(days[0], days[1], "5002"), Interval(days[1], days[2], "5002")]),
                Mapping("ESM4", [Interval(days[0], days[2], "4916")]),
            ],
            version=version,
        )
    )


def _set_u32(data: bytearray, at: int, value: int) -> bytearray:
    struct.pack_into("<I", data, at, value)
    return data


# the metadata of `_metadata(3)`: the 8-byte prelude, 100 fixed bytes (the symbol length, 71, at 45), the schema
# definition length, then the counts: symbols (1 of 71 bytes), partial (0), not_found (0), mappings
SYMBOLS_AT, MAPPINGS_AT = 8 + 104, 8 + 104 + 4 + 71 + 4 + 4
SHORT_HEADERS = {
    "metadata length 100 (the decoder reads past it)": lambda m: _set_u32(bytearray(m[:108]), 4, 100),
    "4,294,967,295 mappings": lambda m: _set_u32(bytearray(m), MAPPINGS_AT, 0xFFFFFFFF),
    "4,294,967,295 symbols": lambda m: _set_u32(bytearray(m), SYMBOLS_AT, 0xFFFFFFFF),
    "symbol length 0 with 4,294,967,295 symbols": lambda m: _set_u32(
        bytearray(m[: 8 + 45]) + b"\x00\x00" + m[8 + 47 :], SYMBOLS_AT, 0xFFFFFFFF
    ),
}


@pytest.mark.parametrize("name", SHORT_HEADERS)
def test_metadata_counts_that_do_not_fit_are_refused_before_the_decoder(tmp_path, name):
    data = SHORT_HEADERS[name](bytearray(_metadata(3)))
    path = tmp_path / "crafted.dbn"
    path.write_bytes(bytes(data))
    done = run_alpha("inspect", str(path))
    assert done.returncode == 2 and "alpha inspect:" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "not a valid DBN file: metadata." in done.stderr, done.stderr


FUZZ = """
import json, random, struct, sys
from pathlib import Path
from alpha_core.data.dbn import read_info
from alpha_core.errors import DataError
random.seed(int(sys.argv[1]))
bases = [bytes.fromhex(h) for h in sys.argv[3].split(",")]
extreme = [0, 1, 2, 0x7F, 0x80, 0xFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 100, 104, 120]
path = Path(sys.argv[2])
outcomes = {"decoded": 0, "refused": 0}
for case in range(int(sys.argv[4])):
    b = bytearray(random.choice(bases))
    for _ in range(random.randint(1, 3)):
        r = random.random()
        if r < 0.4:
            struct.pack_into("<I", b, random.randrange(0, len(b) - 4), random.choice(extreme))
        elif r < 0.6:
            struct.pack_into("<H", b, random.randrange(0, len(b) - 2), random.choice(extreme) & 0xFFFF)
        elif r < 0.8:
            b[random.randrange(0, len(b))] = random.randrange(256)
        elif r < 0.9:
            b = b[:random.randrange(8, len(b))]
        else:
            struct.pack_into("<I", b, 4, random.choice(extreme + [len(b) - 8, len(b) - 9, len(b) - 7]))
    path.write_bytes(bytes(b))
    try:
        read_info(path)
        outcomes["decoded"] += 1
    except DataError:
        outcomes["refused"] += 1
print(json.dumps(outcomes))
"""


def test_mutated_metadata_never_panics_or_aborts_the_decoder(tmp_path):
    """3,000 mutations of real v1/v2/v3 headers (counts and lengths set to extremes, bytes flipped, cuts): each
    decodes or is one DataError; a Rust panic (a BaseException) or an abort (a signal) would end the child."""
    bases = ",".join(_metadata(v).hex() for v in (1, 2, 3))
    done = subprocess.run(
        [sys.executable, "-c", FUZZ, "7", str(tmp_path / "m.dbn"), bases, "3000"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = json.loads(done.stdout.strip())
    assert outcomes["refused"] > 1000 and outcomes["decoded"] > 100, outcomes


def _repeated_snapshot(tiny_data: Path, n: int) -> bytes:
    head, r = header_and_records(book_file(tiny_data))
    i = int(np.flatnonzero((r["flags"] & 128) != 0)[100])
    return head + r[i : i + 1].tobytes() * n


def test_a_zstd_record_bomb_is_refused_by_its_ratio(tiny_data, tmp_path, capsys):
    """One valid snapshot repeated 200,000 times compresses 10,000x (74 MB from 7 KB): refused after 16 MiB plus
    200x what was read, where it became a 57 MB sidecar (the issue's 124 KB bomb: 1.19 GB) that passed the checks."""
    bomb = tmp_path / "data" / "ES.FUT" / "mbp-10" / "ES.FUT_2024-Q2.dbn.zst"
    bomb.parent.mkdir(parents=True)
    bomb.write_bytes(zstandard.ZstdCompressor(level=1).compress(_repeated_snapshot(tiny_data, 200_000)))
    assert bomb.stat().st_size < 20_000
    cache = tmp_path / "pd"
    assert main(["predecode", "--data-dir", str(tmp_path / "data"), "--output-dir", str(cache)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and bomb.name in err, err
    assert "zstd stream decompresses to over" in err and "more than 200x (ALPHA_MAX_ZSTD_RATIO)" in err, err
    assert not cache.exists() or not any(cache.rglob("*"))


def test_real_compression_ratios_pass(tiny_data, tmp_path, monkeypatch):
    """The demo quarters decode 10.5x (full) and 8x (tiny) their size: they pass a limit well under the default,
    with no allowance."""
    monkeypatch.setattr("alpha_core.data.dbn.ZSTD_RATIO_FREE_BYTES", 0)
    monkeypatch.setenv("ALPHA_MAX_ZSTD_RATIO", "20")
    sc, status = ensure_sidecar(book_file(tiny_data), tmp_path)
    assert status == "built" and sc.rows > 1000


@pytest.mark.parametrize("packing", ["zstd", "plain"])
def test_the_record_count_is_bounded(tiny_data, tmp_path, monkeypatch, packing):
    head, r = header_and_records(book_file(tiny_data))
    path = tmp_path / f"ES.FUT_2024-Q2.dbn{'.zst' if packing == 'zstd' else ''}"
    data = head + r.tobytes()
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if packing == "zstd" else data)
    monkeypatch.setenv("ALPHA_MAX_RECORDS", "1000")
    message = (
        f"holds {len(r):,} records, more than the limit of 1,000"
        if packing == "plain"
        else "record 1,000: more records than the limit of 1,000"
    )
    with pytest.raises(DataError, match=rf"{path.name}: .*{message} \(ALPHA_MAX_RECORDS\)"):
        ensure_sidecar(path, tmp_path / "pd")
    assert not any((tmp_path / "pd").rglob("*"))
    monkeypatch.setenv("ALPHA_MAX_RECORDS", str(len(r)))
    assert ensure_sidecar(path, tmp_path / "pd")[1] == "built"


def test_the_sidecar_size_is_bounded_before_it_is_written(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("ALPHA_MAX_SIDECAR_BYTES", "100000")
    with pytest.raises(
        DataError,
        match=r"ES.FUT_2024-Q2.dbn.zst: its sidecar would take [\d,]+ bytes \([\d,]+ rows\), "
        r"over the limit of 100,000 \(ALPHA_MAX_SIDECAR_BYTES\)",
    ):
        ensure_sidecar(book_file(tiny_data), tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5"])
def test_a_bad_bound_is_one_line_naming_the_variable(tiny_data, tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv("ALPHA_MAX_ZSTD_RATIO", value)
    with pytest.raises(PlanError, match=rf"ALPHA_MAX_ZSTD_RATIO must be a positive integer \(got '{value}'\)"):
        ensure_sidecar(book_file(tiny_data), tmp_path)
    assert main(["inspect", str(book_file(tiny_data))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ALPHA_MAX_ZSTD_RATIO must be a positive integer" in err, err
