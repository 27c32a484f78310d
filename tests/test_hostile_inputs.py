"""Hostile DBN inputs, generated here from the tiny demo files: every command that reads one exits non-zero with
one line naming the file and the field, and a failed predecode leaves nothing behind. Legal but suspicious data
fails the integrity check instead, and legal oddities (files named alike, wide metadata ranges, several zstd
frames) still work."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import databento as db
import databento_dbn as dbn
import numpy as np
import pytest
import zstandard

from alpha_core.cli import main
from alpha_core.data.sidecar import ensure_sidecar
from alpha_core.errors import DataError
from alpha_core.sessions import session_days

BOOK, BARS = "mbp-10", "ohlcv-1m"
UNDEF = dbn.UNDEF_PRICE
TICK = 250_000_000  # 0.25 in fixed-point 1e-9, the ES tick
YEAR_2200 = int(dt.datetime(2200, 1, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000_000
YEAR_1985 = int(dt.datetime(1985, 1, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000_000


@dataclass
class _Interval:
    start_date: dt.date
    end_date: dt.date
    symbol: str


@dataclass
class _Mapping:
    raw_symbol: str
    intervals: list


def source(tiny: Path, schema: str, quarter: int, root: str = "ES") -> Path:
    return tiny / f"{root}.FUT" / schema / f"{root}.FUT_2024-Q{quarter}.dbn.zst"


def load(path: Path) -> tuple[dbn.Metadata, np.ndarray]:
    store = db.DBNStore.from_file(path)
    return store.metadata, store.to_ndarray().copy()


def write(dst: Path, meta, records: np.ndarray | bytes, tail: bytes = b"", shift_days: int = 0, **override) -> Path:
    """A genuine DBN file (zstd) from `meta` with fields overridden, mapping dates shifted, and raw bytes appended."""
    shift = dt.timedelta(days=shift_days)
    fields = dict(
        dataset=meta.dataset,
        schema=meta.schema,
        start=meta.start,
        end=meta.end,
        stype_in=meta.stype_in,
        stype_out=dbn.SType.INSTRUMENT_ID,
        symbols=list(meta.symbols),
        mappings=[
            _Mapping(raw, [_Interval(i["start_date"] + shift, i["end_date"] + shift, i["symbol"]) for i in ivs])
            for raw, ivs in meta.mappings.items()
        ],
    )
    fields.update(override)
    body = records.tobytes() if isinstance(records, np.ndarray) else records
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(zstandard.ZstdCompressor(level=1).compress(bytes(dbn.Metadata(**fields)) + body + tail))
    return dst


def outright_ids(meta) -> np.ndarray:
    return np.array([int(i["symbol"]) for raw, ivs in meta.mappings.items() if "-" not in raw for i in ivs])


def middle(mask: np.ndarray) -> int:
    idx = np.flatnonzero(mask)
    return int(idx[len(idx) // 2])


def snapshot(meta, r: np.ndarray) -> int:
    """A book record of an outright contract with size at the best bid and ask."""
    return middle(np.isin(r["instrument_id"], outright_ids(meta)) & (r["bid_sz_00"] > 0) & (r["ask_sz_00"] > 0))


def trade(meta, r: np.ndarray) -> int:
    return middle(np.isin(r["instrument_id"], outright_ids(meta)) & (r["action"] == b"T"))


def bar(meta, r: np.ndarray) -> int:
    return middle(np.isin(r["instrument_id"], outright_ids(meta)) & (r["high"] > r["low"]))


# --- the hostile files: each builder writes into `folder` and returns (files, needles of the message) -------------


@dataclass
class Case:
    schema: str
    build: Callable[[Path, Path], tuple[list[Path], list[str]]]
    per_file: bool = True  # the file alone is hostile (so `alpha inspect` of it fails too)
    # valid DBN whose prices do not fit the product: `alpha inspect` describes it with a warning naming the field
    inspect_warns: bool = False
    # what is hostile lies in what a fold plan reads (layout, timestamps, metadata, the file set); prices and
    # instrument ids are read where sidecars are built, so `alpha folds` plans such a file (reading timestamps only)
    timestamps: bool = True


def book_field(field: str, value: int, where: Callable = snapshot, needle: str = "") -> Case:
    def build(tiny: Path, folder: Path):
        meta, r = load(source(tiny, BOOK, 2))
        i = where(meta, r)
        r[field][i] = value(r[field][i]) if callable(value) else value
        return [write(folder / "hostile.dbn.zst", meta, r)], [f"record {i}: {field} {needle}"]

    return Case(BOOK, build, timestamps=False)


def bar_edit(edit: Callable[[np.ndarray, int], str]) -> Case:
    def build(tiny: Path, folder: Path):
        meta, r = load(source(tiny, BARS, 2))
        i = bar(meta, r)
        needle = edit(r, i)
        return [write(folder / "hostile.dbn.zst", meta, r)], [f"record {i}: {needle}"]

    return Case(BARS, build, timestamps=False)


def _set(field: str, value, needle: str) -> Callable[[np.ndarray, int], str]:
    def edit(r: np.ndarray, i: int) -> str:
        r[field][i] = value(r, i) if callable(value) else value
        return needle

    return edit


def _swap_high_low(r: np.ndarray, i: int) -> str:
    r["high"][i], r["low"][i] = r["low"][i], r["high"][i]
    return "high"


def records_edit(schema: str, edit: Callable, timestamps: bool = True, **meta_over) -> Case:
    """`edit(meta, records)` changes records in place and returns the needle; `meta_over(meta, records)` metadata."""

    def build(tiny: Path, folder: Path):
        meta, r = load(source(tiny, schema, 2))
        needle = edit(meta, r)
        over = {k: v(meta, r) for k, v in meta_over.items()}
        return [write(folder / "hostile.dbn.zst", meta, r, **over)], [needle]

    return Case(schema, build, timestamps=timestamps)


def _future_ts(meta, r):
    i = len(r) // 2
    r["ts_recv"][i:] = YEAR_2200 + np.arange(len(r) - i)
    return f"record {i}: ts_recv is 2200-01-01"


def _old_ts(meta, r):
    r["ts_recv"][0] = YEAR_1985
    return "record 0: ts_recv is 1985-01-01"


def _backwards(meta, r):
    r["ts_recv"][[100, 101]] = r["ts_recv"][[101, 100]]
    return "record 101: ts_recv goes backwards"


def _undef_event(meta, r):
    i = len(r) // 3
    r["ts_event"][i] = dbn.UNDEF_TIMESTAMP
    return f"record {i}: ts_event is undefined"


def _future_bar(meta, r):
    i = len(r) - 1
    r["ts_event"][i] = YEAR_2200
    return f"record {i}: ts_event is 2200-01-01"


def _unmapped(meta, r):
    i = len(r) // 2
    r["instrument_id"][i] = 4242
    return f"record {i}: instrument_id 4242 maps to no symbol in metadata.mappings"


def _rtype(meta, r):
    i = len(r) // 2
    r["rtype"][i] = dbn.RType.MBP_1.value
    return f"record {i}: rtype is 1"


def _length(meta, r):
    i = len(r) // 2
    r["length"][i] = 93
    return f"record {i}: length is 93 words"


def other_schema(claimed, records_of: str, needle: str) -> Case:
    """Metadata claims one schema, the records are another's."""

    def build(tiny: Path, folder: Path):
        meta, r = load(source(tiny, records_of, 2))
        return [write(folder / "hostile.dbn.zst", meta, r, schema=claimed)], [needle]

    return Case(BOOK if records_of == BARS else BARS, build)


def raw_file(data: Callable[[Path], bytes], needle: str) -> Case:
    def build(tiny: Path, folder: Path):
        path = folder / "hostile.dbn.zst"
        path.write_bytes(data(tiny))
        return [path], [needle]

    return Case(BOOK, build)


def meta_edit(schema: str, needle: str, shift_days: int = 0, timestamps: bool = True, **over: Callable) -> Case:
    def build(tiny: Path, folder: Path):
        meta, r = load(source(tiny, schema, 2))
        values = {k: v(meta, r) for k, v in over.items()}
        return [write(folder / "hostile.dbn.zst", meta, r, shift_days=shift_days, **values)], [needle]

    return Case(schema, build, timestamps=timestamps)


def _tail(n: int) -> Case:
    def build(tiny: Path, folder: Path):
        meta, r = load(source(tiny, BOOK, 2))
        return [write(folder / "hostile.dbn.zst", meta, r, tail=bytes(n))], [f"file is truncated: {n} bytes"]

    return Case(BOOK, build)


def _garbage_frame(tiny: Path, folder: Path):
    """A second zstd frame of junk: databento stops at the first frame; the junk must not pass unseen."""
    meta, r = load(source(tiny, BOOK, 2))
    path = write(folder / "hostile.dbn.zst", meta, r)
    junk = np.random.default_rng(1).integers(0, 255, size=368 * 10, dtype=np.uint8).tobytes()
    path.write_bytes(path.read_bytes() + zstandard.ZstdCompressor().compress(junk))
    return [path], [f"record {len(r)}: length is"]


def _truncated(tiny: Path) -> bytes:
    data = source(tiny, BOOK, 2).read_bytes()
    return data[: int(len(data) * 0.7)]


def _duplicate(tiny: Path, folder: Path):
    copy = folder / "again" / "copy.dbn.zst"
    copy.parent.mkdir()
    shutil.copy(source(tiny, folder.name, 1), copy)  # the folder is named after its schema
    return [copy], ["same content (sha256", "ES.FUT_2024-Q1.dbn.zst"]


def _overlap(tiny: Path, folder: Path):
    meta, r = load(source(tiny, BOOK, 1))
    r["bid_sz_00"][5] += 1  # other content, the same time range as Q1
    return [write(folder / "overlap.dbn.zst", meta, r)], ["records overlap", "ES.FUT_2024-Q1.dbn.zst"]


def _partial_overlap(tiny: Path, folder: Path):
    """Q2 with the last hour of Q1 in front: only a few records share their time with Q1's."""
    m1, r1 = load(source(tiny, BOOK, 1))
    m2, r2 = load(source(tiny, BOOK, 2))
    tail = r1[r1["ts_recv"] > r1["ts_recv"][-1] - 3_600 * 10**9]
    merged: dict[str, list] = {}
    for meta in (m1, m2):
        for raw, ivs in meta.mappings.items():
            merged.setdefault(raw, []).extend(_Interval(i["start_date"], i["end_date"], i["symbol"]) for i in ivs)
    mappings = [_Mapping(raw, ivs) for raw, ivs in merged.items()]
    path = write(folder / "overlap.dbn.zst", m2, np.concatenate([tail, r2]), start=m1.start, mappings=mappings)
    return [path], ["records overlap", "ES.FUT_2024-Q1.dbn.zst"]


def _other_product(tiny: Path, folder: Path):
    nq = folder / "NQ.FUT_2024-Q2.dbn.zst"
    shutil.copy(source(tiny, BOOK, 2, root="NQ"), nq)
    return [nq], ["maps"]


def _off_grid(tiny: Path, folder: Path):
    """A best bid 0.10 above an ES price: inside the ES range, off its 0.25 grid."""
    meta, r = load(source(tiny, BOOK, 2))
    i = snapshot(meta, r)
    r["bid_px_00"][i] += 100_000_000
    return [write(folder / "hostile.dbn.zst", meta, r)], [f"record {i}: bid_px_00 is", "not on the ES.FUT tick grid (0.25)"]


def _zn_bar(r: np.ndarray, i: int) -> str:
    """A consistent bar at a 10-Year Note price (110.5) in an ES file."""
    for f in ("open", "high", "low", "close"):
        r[f][i] = 110_500_000_000
    return "open is 110.5 for a bar of"


def _nq_labelled_es(tiny: Path, folder: Path):
    """An NQ file whose metadata says ES: every symbol renamed, the NQ prices (about 17,500) left as they are."""
    meta, r = load(source(tiny, BOOK, 2, root="NQ"))
    mappings = [
        _Mapping(raw.replace("NQ", "ES"), [_Interval(i["start_date"], i["end_date"], i["symbol"]) for i in ivs])
        for raw, ivs in meta.mappings.items()
    ]
    path = write(folder / "ES.FUT_2024-Q2.dbn.zst", meta, r, symbols=["ES.FUT"], mappings=mappings)
    return [path], ["outside the plausible ES.FUT range [500, 15000]"]


def _sample_from_2020(tiny: Path, folder: Path):
    """The real 4-record ESH1 sample of 2020-12-28 among the 2024 quarters."""
    from conftest import SAMPLES

    sample = folder / "test_data.mbp-10.dbn.zst"
    shutil.copy(SAMPLES / "databento-python" / "GLBX.MDP3" / sample.name, sample)
    return [sample], ["days before the folder's other mbp-10 files", "far outside the folder's range"]


def _four_records(tiny: Path, folder: Path):
    """Beside two full quarters, a third holding only its first 4 records (its metadata range is the quarter's)."""
    shutil.copy(source(tiny, BOOK, 2), folder)
    meta, r = load(source(tiny, BOOK, 3))
    return [write(folder / "ES.FUT_2024-Q3.dbn.zst", meta, r[:4])], ["under 1% of the median mbp-10 file"]


def _not_utf8(tiny: Path, folder: Path):
    path = Path(os.fsdecode(bytes(folder) + b"/ES.FUT_\xff.dbn.zst"))
    shutil.copy(source(tiny, BOOK, 2), path)
    return [path], ["file name is not valid UTF-8"]


def _newline_name(tiny: Path, folder: Path):
    path = folder / "ES.FUT_2024\nQ2.dbn.zst"
    shutil.copy(source(tiny, BOOK, 2), path)
    return [path], ["file name holds control characters"]


def _fifo(tiny: Path, folder: Path):
    path = folder / "pipe.dbn.zst"
    os.mkfifo(path)
    return [path], ["not a regular file"]


def _broken_link(tiny: Path, folder: Path):
    path = folder / "gone.dbn.zst"
    path.symlink_to(folder / "nowhere.dbn.zst")
    return [path], ["does not exist"]


HOSTILE: dict[str, Case] = {
    # prices that must exist
    "book-zero-bid": book_field("bid_px_00", 0, needle="is 0 (a zero price)"),
    "book-negative-ask": book_field("ask_px_00", -TICK, needle="is -0.25 (a negative price)"),
    "book-undef-bid-with-size": book_field("bid_px_00", UNDEF, needle="is undefined (UNDEF_PRICE)"),
    "trade-zero-price": book_field("price", 0, trade, "is 0 (a zero price) for a trade"),
    "trade-undef-price": book_field("price", UNDEF, trade, "is undefined (UNDEF_PRICE) for a trade"),
    "bar-zero-close": bar_edit(_set("close", 0, "close is 0 (a zero price)")),
    "bar-negative-open": bar_edit(_set("open", -TICK, "open is -0.25 (a negative price)")),
    "bar-undef-low": bar_edit(_set("low", UNDEF, "low is undefined (UNDEF_PRICE)")),
    "bar-high-below-low": bar_edit(_swap_high_low),
    "bar-close-above-high": bar_edit(_set("close", lambda r, i: r["high"][i] + TICK, "close")),
    "bar-open-below-low": bar_edit(_set("open", lambda r, i: r["low"][i] - TICK, "open")),
    # prices against the product
    "nq-prices-labelled-es": Case(BOOK, _nq_labelled_es, timestamps=False, inspect_warns=True),
    "book-bid-off-the-tick-grid": Case(BOOK, _off_grid, timestamps=False, inspect_warns=True),
    "bar-at-a-zn-price": Case(BARS, bar_edit(_zn_bar).build, timestamps=False, inspect_warns=True),
    # timestamps
    "ts-in-2200": records_edit(BOOK, _future_ts, end=lambda m, r: None),
    "ts-before-1990": records_edit(BOOK, _old_ts),
    "ts-backwards": records_edit(BOOK, _backwards),
    "ts-event-undefined": records_edit(BOOK, _undef_event),
    "bar-ts-in-2200": records_edit(BARS, _future_bar, end=lambda m, r: None),
    "record-before-metadata-start": meta_edit(BOOK, "record 0: ts_recv", start=lambda m, r: int(r["ts_recv"][0]) + 1),
    "record-after-metadata-end": meta_edit(BARS, "at or after metadata.end", end=lambda m, r: int(r["ts_event"][-1])),
    "metadata-end-before-start": meta_edit(BOOK, "metadata.end", end=lambda m, r: m.start),
    # layout
    "claims-ohlcv-holds-mbp10": other_schema(dbn.Schema.OHLCV_1M, BOOK, "record 0: length is 92 words"),
    "claims-mbp10-holds-ohlcv": other_schema(dbn.Schema.MBP_10, BARS, "record 0: length is 14 words"),
    "claims-trades-holds-ohlcv": other_schema(dbn.Schema.TRADES, BARS, "trades"),
    "rtype-of-another-schema": records_edit(BOOK, _rtype),
    "record-length-field": records_edit(BOOK, _length),
    "trailing-partial-record": _tail(100),
    "junk-second-zstd-frame": Case(BOOK, _garbage_frame),
    "truncated-zstd": raw_file(_truncated, "truncated"),
    "random-bytes": raw_file(lambda t: np.random.default_rng(0).bytes(5000), "not a valid DBN file"),
    "zstd-csv": raw_file(lambda t: zstandard.ZstdCompressor().compress(b"ts,price\n1,2\n" * 100), "not a valid DBN"),
    "empty-file": raw_file(lambda t: b"", "file is empty"),
    # symbology, dataset, product
    "unmapped-instrument-id": records_edit(BOOK, _unmapped, timestamps=False),
    "mapping-dates-elsewhere": meta_edit(BOOK, "outside its metadata.mappings dates", shift_days=400, timestamps=False),
    "dataset-xnas-itch": meta_edit(BOOK, "metadata.dataset is 'XNAS.ITCH'", dataset=lambda m, r: "XNAS.ITCH"),
    "nq-file-in-es-folder": Case(BOOK, _other_product, per_file=False),
    # the set
    "duplicate-content": Case(BOOK, _duplicate, per_file=False),
    "overlapping-files": Case(BOOK, _overlap, per_file=False),
    "partly-overlapping-files": Case(BOOK, _partial_overlap, per_file=False),
    "a-2020-sample-among-2024-quarters": Case(BOOK, _sample_from_2020, per_file=False),
    "four-records-beside-full-quarters": Case(BOOK, _four_records, per_file=False),
    # names and kinds of file
    "non-utf8-file-name": Case(BOOK, _not_utf8),
    "newline-in-file-name": Case(BOOK, _newline_name),
    "fifo-named-dbn": Case(BOOK, _fifo),
    "broken-symlink": Case(BOOK, _broken_link),
}


def shown(path: Path) -> str:
    """A file name as the messages print it (bytes that are not UTF-8, and control characters, escaped)."""
    text = os.fsencode(path.name).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def run(capsys, *argv: str) -> tuple[int, str]:
    """`alpha ARGV` in this process: the exit code and stderr (stdout stays in `run.out`)."""
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    run.out = captured.out
    return code, captured.err


def assert_refused(code: int, err: str, files: list[Path], needles: list[str]) -> None:
    assert code != 0, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error" in line or line.startswith("alpha inspect:")]
    assert len(lines) == 1, err
    assert any(shown(f) in lines[0] for f in files), (lines[0], [shown(f) for f in files])
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def nothing_left(cache: Path) -> bool:
    return not cache.exists() or not any(cache.rglob("*"))


@pytest.fixture
def symbol_dir(tmp_path, tiny_data):
    """`data/ES.FUT/` holding the first quarter of each schema: a good file each reader meets before the bad one."""
    root = tmp_path / "data" / "ES.FUT"
    for schema in (BOOK, BARS):
        (root / schema).mkdir(parents=True)
        shutil.copy(source(tiny_data, schema, 1), root / schema)
    return root


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_input_is_refused_by_every_reader(name, tiny_data, symbol_dir, tmp_path, capsys):
    case = HOSTILE[name]
    files, needles = case.build(tiny_data, symbol_dir / case.schema)
    cache = tmp_path / "predecoded"

    code, err = run(capsys, "predecode", "--data-dir", tmp_path / "data", "--predecoded-dir", cache)
    assert_refused(code, err, files, needles)
    assert nothing_left(cache), sorted(cache.rglob("*"))

    code, err = run(capsys, "folds", "--data-dir", symbol_dir, "--schema", case.schema, "--cv-n-folds", "1")
    if case.timestamps:
        assert_refused(code, err, files, needles)
    else:  # a fold plan reads timestamps only: what it does not read, it does not judge
        assert code == 0, err

    if case.inspect_warns:  # an inspection shows valid DBN, and warns naming the file and the field
        code, err = run(capsys, "inspect", files[0])
        warnings = err.splitlines()  # one per contract
        assert code == 0 and warnings and all(w.startswith("alpha inspect: warning: ") for w in warnings), err
        assert shown(files[0]) in warnings[0] and all(needle in warnings[0] for needle in needles), (needles, err)
        assert f"{shown(files[0])}\n  schema={case.schema}" in run.out, run.out
    elif case.per_file:
        code, err = run(capsys, "inspect", files[0])
        assert_refused(code, err, files, needles)


TRAINERS = {
    BOOK: lambda d, cache, out: [
        "train",
        "--mbp10-data-dir",
        d / BOOK,
        "--predecoded-dir",
        cache,
        "--out",
        out,
        "--epochs",
        "1",
        "--device",
        "cpu",
    ],
    BARS: lambda d, cache, out: [
        "train-supervised",
        "--model",
        "tft",
        "--data-dir",
        d,
        "--predecoded-dir",
        cache,
        "--output-dir",
        out,
        "--epochs",
        "1",
        "--device",
        "cpu",
    ],
}


@pytest.mark.parametrize(
    "name",
    ["book-zero-bid", "bar-high-below-low", "ts-in-2200", "overlapping-files", "dataset-xnas-itch", "claims-mbp10-holds-ohlcv"],
)
def test_trainers_refuse_hostile_input_before_training(name, tiny_data, symbol_dir, tmp_path, capsys):
    case = HOSTILE[name]
    files, needles = case.build(tiny_data, symbol_dir / case.schema)
    cache = tmp_path / "predecoded"
    code, err = run(capsys, *TRAINERS[case.schema](symbol_dir, cache, tmp_path / "out"))
    assert_refused(code, err, files, needles)
    assert nothing_left(cache)


@pytest.fixture(scope="module")
def checkpoint(tiny_data, tmp_path_factory) -> Path:
    """A TFT checkpoint trained (one tiny epoch) on the first two bar files: `alpha evaluate` has something to
    evaluate, so it reads the symbol's data."""
    root = tmp_path_factory.mktemp("evaluate")
    (root / "data" / "ES.FUT" / BARS).mkdir(parents=True)
    for quarter in (1, 2):
        shutil.copy(source(tiny_data, BARS, quarter), root / "data" / "ES.FUT" / BARS)
    code = main(
        [
            "train-supervised",
            "--model",
            "tft",
            "--data-dir",
            str(root / "data" / "ES.FUT"),
            "--epochs",
            "1",
            "--output-dir",
            str(root / "models" / "tft" / "ES.FUT"),
            "--predecoded-dir",
            str(root / "pd"),
            "--n-train-seqs",
            "16",
            "--n-val-seqs",
            "16",
            "--batch-size",
            "16",
            "--device",
            "cpu",
            "--cv-n-folds",
            "1",
        ]
    )
    assert code == 0
    return root


@pytest.mark.filterwarnings("ignore:--cv-n-folds 1 is the single")  # the checkpoint's fold has no test file
@pytest.mark.parametrize("name", ["bar-zero-close", "bar-ts-in-2200", "duplicate-content"])
def test_evaluate_refuses_hostile_input(name, checkpoint, tiny_data, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(checkpoint / "data", data)
    case = HOSTILE[name]
    if name != "duplicate-content":  # the hostile file is made from Q2: it takes Q2's place (not a second Q2)
        (data / "ES.FUT" / case.schema / "ES.FUT_2024-Q2.dbn.zst").unlink()
    files, needles = case.build(tiny_data, data / "ES.FUT" / (BARS if name == "duplicate-content" else case.schema))
    cache = tmp_path / "predecoded"
    code, err = run(
        capsys,
        "evaluate",
        "--models-dir",
        checkpoint / "models",
        "--data-dir",
        data,
        "--output",
        tmp_path / "report" / "ensemble_report.json",
        "--predecoded-dir",
        cache,
        "--min-val-auc",
        "0",
        "--min-val-sharpe",
        "-1000",
    )  # the tiny checkpoint is read whatever its AUC
    assert_refused(code, err, files, needles)
    assert nothing_left(cache)


# --- legal but suspicious: a failed integrity check, not an error ---------------------------------------------


def _sessions(ts: np.ndarray) -> np.ndarray:
    return session_days(ts.astype(np.int64))


def _wide_spread(meta, r):
    window = slice(len(r) // 2, len(r) // 2 + 200)
    part = r[window]
    ok = np.isin(part["instrument_id"], outright_ids(meta)) & (part["bid_px_00"] != UNDEF) & (part["ask_px_00"] != UNDEF)
    # a bid 1,500 points under the ask: an ES price on the ES grid, but not a believable book
    part["bid_px_00"][ok] = part["ask_px_00"][ok] - 6000 * TICK
    r[window] = part
    return r


def _price_jump(meta, r):
    i = bar(meta, r)
    ok = np.isin(r["instrument_id"], outright_ids(meta))
    window = np.zeros(len(r), dtype=bool)
    window[i : i + 20] = True
    for f in ("open", "high", "low", "close"):
        r[f][window & ok] = r[f][window & ok] // 5 * 6
    return r


def _hours_missing(meta, r):
    s = _sessions(r["ts_recv"])
    middle_day = np.unique(s)[1]
    t = r["ts_recv"][s == middle_day]
    cut_from = t[len(t) // 3]
    return r[(r["ts_recv"] < cut_from) | (r["ts_recv"] >= cut_from + 4 * 3_600 * 10**9)]


def _session_nearly_empty(meta, r):
    s = _sessions(r["ts_recv"])
    middle_day = np.unique(s)[1]
    inside = np.flatnonzero(s == middle_day)
    return np.delete(r, inside[10:])


def _locked_books(meta, r):
    snapshots = np.flatnonzero(np.isin(r["instrument_id"], outright_ids(meta)) & (r["flags"] & dbn.F_LAST != 0))
    locked = snapshots[::3]  # a third of the snapshots: bid = ask, a locked book (legal, but no mid to trade at)
    r["bid_px_00"][locked] = r["ask_px_00"][locked]
    return r


SUSPICIOUS = {
    "a-third-of-the-books-locked": (BOOK, _locked_books, "have no valid best bid and ask"),
    "spread-of-6000-ticks": (BOOK, _wide_spread, "spread_ticks is 6000"),
    "price-jump-of-20-percent": (BARS, _price_jump, "price jumps 20.0%"),
    "four-hours-missing-in-a-session": (BOOK, _hours_missing, "inside session"),
    "session-with-a-handful-of-rows": (BOOK, _session_nearly_empty, "rows, under 5% of the median session"),
}


@pytest.mark.parametrize("name", SUSPICIOUS)
def test_suspicious_data_fails_the_integrity_check(name, tiny_data, symbol_dir, tmp_path, capsys):
    schema, edit, needle = SUSPICIOUS[name]
    meta, r = load(source(tiny_data, schema, 2))
    path = write(symbol_dir / schema / "odd.dbn.zst", meta, edit(meta, r))
    code, err = run(capsys, "predecode", "--data-dir", tmp_path / "data", "--predecoded-dir", tmp_path / "pd")
    problems = [line for line in err.splitlines() if "integrity:" in line]
    assert code == 1 and "Traceback" not in err, err
    assert any(path.name in p and needle in p for p in problems), problems
    assert not any("ES.FUT_2024-Q1" in p for p in problems), problems  # the good files pass


def test_the_sessions_missing_check(tiny_data, symbol_dir, tmp_path, capsys):
    """Six days without a single bar (the last session moved a week later) is reported, not refused."""
    meta, r = load(source(tiny_data, BARS, 2))
    s = _sessions(r["ts_event"])
    last = s == s.max()
    r["ts_event"][last] += 6 * 86_400 * 10**9
    path = write(
        symbol_dir / BARS / "late.dbn.zst",
        meta,
        r,
        shift_days=0,
        end=meta.end + 7 * 86_400 * 10**9,
        mappings=[
            _Mapping(raw, [_Interval(i["start_date"], i["end_date"] + dt.timedelta(days=7), i["symbol"]) for i in ivs])
            for raw, ivs in meta.mappings.items()
        ],
    )
    code, err = run(capsys, "predecode", "--data-dir", tmp_path / "data", "--predecoded-dir", tmp_path / "pd")
    assert code == 1 and f"{path.name}: ts has no rows for 6." in err and "sessions missing" in err, err


# --- legal oddities keep working ----------------------------------------------------------------------------


def test_files_named_alike_in_two_folders_keep_their_own_sidecars(tiny_data, tmp_path, capsys):
    folder = tmp_path / "data" / "ES.FUT"
    for sub, quarter in (("a", 1), ("b", 2)):
        (folder / sub).mkdir(parents=True)
        shutil.copy(source(tiny_data, BOOK, quarter), folder / sub / "same.dbn.zst")
    cache = tmp_path / "pd"
    for status in ("built", "reused"):
        code, err = run(capsys, "predecode", "--data-dir", tmp_path / "data", "--predecoded-dir", cache)
        assert code == 0, err
        assert [line.split()[0] for line in run.out.splitlines()] == [status, status]
    sidecars = sorted(p.name for p in (cache / "ES.FUT").iterdir())
    assert len(sidecars) == 2 and all(p.startswith("same.ES.book.") for p in sidecars), sidecars


@pytest.mark.filterwarnings("ignore:--cv-n-folds 1 is the single")  # the plain train/validation split
def test_file_order_follows_the_records_not_the_metadata(tiny_data, tmp_path, capsys):
    """Q2's metadata starts before Q1's (a wide request range), but its records come after Q1's."""
    folder = tmp_path / "data" / "ES.FUT"
    (folder / BOOK).mkdir(parents=True)
    shutil.copy(source(tiny_data, BOOK, 1), folder / BOOK)
    shutil.copy(source(tiny_data, BOOK, 3), folder / BOOK)
    m1, _ = load(source(tiny_data, BOOK, 1))
    meta, r = load(source(tiny_data, BOOK, 2))
    write(folder / BOOK / "ES.FUT_2024-Q2.dbn.zst", meta, r, start=m1.start - 86_400 * 10**9)
    code, err = run(capsys, "folds", "--data-dir", folder, "--cv-n-folds", "1", "--json")
    assert code == 0, err
    fold = json.loads(run.out)[BOOK]["folds"][0]
    assert [f["name"] for f in fold["train"] + fold["val"]] == [f"2024-Q{q}" for q in (1, 2, 3)]  # by the records
    assert [p["name"] for f in fold["train"] + fold["val"] for p in f["parts"]] == [
        f"ES.FUT_2024-Q{q}.dbn.zst" for q in (1, 2, 3)
    ]
    assert fold["train"][1]["start"] == int(r["ts_recv"][0])  # the record range, not the metadata's
    code, err = run(capsys, "predecode", "--data-dir", tmp_path / "data", "--predecoded-dir", tmp_path / "pd")
    assert code == 0, err
    assert [line.split()[3] for line in run.out.splitlines()] == [f"ES.FUT_2024-Q{q}.dbn.zst:" for q in (1, 2, 3)]


def test_a_file_of_several_zstd_frames_is_read_whole(tiny_data, tmp_path, capsys):
    """databento alone stops at the end of the first frame; the second half of the records must not vanish."""
    meta, r = load(source(tiny_data, BOOK, 2))
    raw = zstandard.ZstdDecompressor().stream_reader(source(tiny_data, BOOK, 2).open("rb")).read()
    cut = len(raw) - r[len(r) // 2 :].nbytes
    two = tmp_path / "two.dbn.zst"
    two.write_bytes(zstandard.ZstdCompressor().compress(raw[:cut]) + zstandard.ZstdCompressor().compress(raw[cut:]))
    code, err = run(capsys, "inspect", two, "--json")
    assert code == 0, err
    assert json.loads(run.out)[0]["records"] == len(r)


def test_an_unusable_cache_is_one_line(tiny_data, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    with pytest.raises(DataError, match=rf"{blocker}: the sidecar cache is not a directory"):
        ensure_sidecar(source(tiny_data, BOOK, 1), blocker)
    with pytest.raises(DataError, match=r"cannot write the sidecar of ES.FUT_2024-Q1.dbn.zst: not a directory"):
        ensure_sidecar(source(tiny_data, BOOK, 1), blocker / "below")


def test_dagster_fails_the_step_with_the_message_and_blocks_on_suspicious_data(tiny_data, symbol_dir, tmp_path):
    import dagster as dg

    from alpha_assets.defs.data import INTEGRITY, book_sidecars
    from alpha_assets.resources import DataRoot, StorageRoot

    resources = {"data": DataRoot(root=str(tmp_path / "data")), "storage": StorageRoot(root=str(tmp_path / "storage"))}
    files, needles = HOSTILE["book-zero-bid"].build(tiny_data, symbol_dir / BOOK)
    result = dg.materialize([book_sidecars], partition_key="ES.FUT", resources=resources, raise_on_error=False)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    error, chain = failure.step_failure_data.error, []
    while error is not None:  # Dagster wraps the op's exception: ours is the cause, shown under the step
        chain.append(error.message)
        error = error.cause
    assert any(m.startswith(f"alpha_core.errors.DataError: {files[0]}: {needles[0]}") for m in chain), chain
    assert nothing_left(tmp_path / "storage" / "predecoded")

    meta, r = load(source(tiny_data, BOOK, 2))
    odd = write(files[0], meta, _wide_spread(meta, r))  # legal, but a spread of 6,000 ticks
    result = dg.materialize([book_sidecars], partition_key="ES.FUT", resources=resources, raise_on_error=False)
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == INTEGRITY and not check.passed
    assert any(odd.name in p and "spread_ticks" in p for p in check.metadata["problems"].value)


@pytest.fixture
def small_mount(tmp_path):
    """Mount a tiny tmpfs (read-only, or 64 KiB): where mounting is not permitted, skip with the reason."""
    import subprocess

    mounted = []

    def mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def test_a_read_only_or_full_cache_is_one_line_and_leaves_nothing(tiny_data, small_mount):
    book = source(tiny_data, BOOK, 1)
    read_only = small_mount("ro,size=1m")
    with pytest.raises(DataError, match=rf"{read_only}: cannot write the sidecar of {book.name}: read-only file system"):
        ensure_sidecar(book, read_only)
    full = small_mount("size=64k")
    with pytest.raises(DataError, match=rf"{full}: cannot write the sidecar of {book.name}: no space left on device"):
        ensure_sidecar(book, full)
    assert list(full.iterdir()) == []  # the temporary directory went with the error


@pytest.mark.parametrize("factor", [2.0, 0.5])
def test_a_file_of_doubled_prices_is_refused_naming_both_files_and_the_field(factor, tiny_data, tmp_path, capsys):
    """Doubled ES prices stay inside ES's range and on its tick grid, so no record check sees them: the jump from the
    previous file's last close to this file's first is beyond what ES moves between files (products.max_file_move)."""
    folder = tmp_path / "data" / "ES.FUT" / BARS
    folder.mkdir(parents=True)
    for quarter in (1, 3):
        shutil.copy(source(tiny_data, BARS, quarter), folder)
    meta, records = load(source(tiny_data, BARS, 2))
    for field in ("open", "high", "low", "close"):
        records[field] = (records[field] * factor).astype(records[field].dtype)
    bad = write(folder / source(tiny_data, BARS, 2).name, meta, records)
    cache = tmp_path / "predecoded"
    code, err = run(capsys, "predecode", "--data-dir", tmp_path / "data", "--predecoded-dir", cache)
    assert code == 2, err
    lines = err.splitlines()
    neighbours = [str(folder / source(tiny_data, BARS, quarter).name) for quarter in (1, 3)]
    assert len(lines) == 1 and lines[0].startswith("alpha predecode: error: "), err
    assert str(bad) in lines[0] and any(n in lines[0] for n in neighbours), err  # the jump into or out of the file
    assert "close (front month) starts at " in lines[0] and "ES.FUT moves between consecutive files" in lines[0], err
    assert nothing_left(cache), sorted(cache.rglob("*"))
