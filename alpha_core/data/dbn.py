"""Read DBN files: metadata through `databento_dbn`, records in bounded-memory checked chunks, parent symbology.

Everything about a file (schema, dataset, symbols, time range) comes from its DBN metadata, never
from its name. Records are decoded here, not by `DBNStore.to_ndarray`, because that silently drops
an incomplete last record and stops at the first zstd frame of a multi-frame file: the stream is
read across frames in fixed-size chunks (a quarter-size file streams in bounded memory), a trailing
partial record is an error, and a cut-off zstd stream (which zstd itself would shorten silently) is
detected first. Every chunk passes `validate.RecordChecks` before anyone sees it.

`databento` itself is not imported: it pulls in pandas, aiohttp and requests (about 0.7 s of CPU per
process) for what `databento_dbn` does alone here, decoding the metadata header and naming record layouts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import databento_dbn as dbn
import numpy as np
import zstandard

from alpha_core.data import validate
from alpha_core.data.products import parse_contract, product
from alpha_core.data.validate import RecordChecks, RecordRange
from alpha_core.errors import DataError

MBP10 = "mbp-10"
OHLCV_1M = "ohlcv-1m"
SUPPORTED_SCHEMAS = (MBP10, OHLCV_1M)
DBN_SUFFIXES = (".dbn", ".dbn.zst")
DEFAULT_CHUNK_BYTES = 1 << 22  # 4 MiB of records per chunk (11k MBP-10, 75k OHLCV): decoding stays in cache
# schema -> record class of `databento_dbn` (its v1 / v2 modules for files of those versions), as
# `databento.common.constants.SCHEMA_STRUCT_MAP*` map them; ohlcv-eod exists from DBN v3 on
RECORD_CLASSES = {
    "definition": "InstrumentDefMsg", "imbalance": "ImbalanceMsg", "mbo": "MBOMsg", "mbp-1": "MBP1Msg",
    "mbp-10": "MBP10Msg", "ohlcv-1s": "OHLCVMsg", "ohlcv-1m": "OHLCVMsg", "ohlcv-1h": "OHLCVMsg",
    "ohlcv-1d": "OHLCVMsg", "ohlcv-eod": "OHLCVMsg", "statistics": "StatMsg", "status": "StatusMsg",
    "tbbo": "MBP1Msg", "trades": "TradeMsg", "cmbp-1": "CMBP1Msg", "cbbo-1s": "CBBOMsg", "cbbo-1m": "CBBOMsg",
    "tcbbo": "CBBOMsg", "bbo-1s": "BBOMsg", "bbo-1m": "BBOMsg",
}
V3_ONLY_SCHEMAS = ("ohlcv-eod",)


@dataclass(frozen=True)
class Interval:
    """One date-bounded mapping of a raw symbol to an instrument id (end date exclusive)."""

    start_date: dt.date
    end_date: dt.date
    instrument_id: int


@dataclass(frozen=True)
class DbnFile:
    """What a DBN file says about itself in its metadata."""

    path: Path
    schema: str
    dataset: str
    version: int
    stype_in: str
    symbols: tuple[str, ...]
    start: int  # ns since epoch, from metadata
    end: int | None  # ns since epoch, exclusive, from metadata (may be absent)
    mappings: dict[str, tuple[Interval, ...]] = field(repr=False)

    @property
    def name(self) -> str:
        return self.path.name

    def products(self) -> set[str]:
        """Contract roots (ES, NQ, ...) of the outright futures this file maps."""
        roots = {c.root for s in self.mappings if (c := parse_contract(s)) is not None}
        if not roots:
            roots = {c.root for s in self.symbols if (c := parse_contract(s)) is not None}
        roots |= {s.split(".")[0] for s in self.symbols if s.endswith(".FUT")}
        return roots

    def outright_ids(self, root: str) -> dict[int, str]:
        """instrument_id -> raw symbol for the outright contracts of `root`; spreads are left out."""
        ids: dict[int, str] = {}
        for raw, intervals in self.mappings.items():
            contract = parse_contract(raw)
            if contract is None or contract.root != root:
                continue
            for iv in intervals:
                known = ids.setdefault(iv.instrument_id, raw)
                if known != raw:
                    raise DataError(
                        self.path,
                        f"metadata.mappings: instrument_id {iv.instrument_id} maps to both {known} and {raw}",
                    )
        return ids


def is_dbn_path(path: Path) -> bool:
    """A name that says DBN (directories aside); whether the file really is one, `read_info` decides."""
    return path.name.endswith(DBN_SUFFIXES) and not path.is_dir()


def _read_metadata(path: Path) -> dbn.Metadata:
    """The metadata header of a DBN file, zstd-compressed (detected by its magic) or not, as written."""
    validate.check_path(path)
    if path.stat().st_size == 0:
        raise DataError(path, "file is empty (0 bytes), not a DBN file")
    try:
        with path.open("rb") as fh:
            compressed = int.from_bytes(fh.read(4), "little") == _ZSTD_MAGIC
            fh.seek(0)
            reader = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True) if compressed else fh
            head = _read_full(reader, 8)
            if head[:3] != b"DBN":
                raise ValueError("no DBN header" + (" after zstd decompression" if compressed else ""))
            body = _read_full(reader, int.from_bytes(head[4:8], "little"))
        return dbn.Metadata.decode(head + body, upgrade_policy=dbn.VersionUpgradePolicy.AS_IS)
    except Exception as exc:  # zstd, DBN and OS errors for junk
        raise DataError(path, f"not a valid DBN file: metadata header unreadable ({exc})") from exc


def read_info(path: str | Path) -> DbnFile:
    """Decode only the metadata header of `path`."""
    path = Path(path)
    meta = _read_metadata(path)
    if meta.schema is None:
        raise DataError(path, "metadata.schema is empty (mixed-schema files are not supported)")
    mappings = {
        raw: tuple(
            Interval(iv["start_date"], iv["end_date"], _instrument_id(path, raw, iv["symbol"]))
            for iv in intervals
        )
        for raw, intervals in meta.mappings.items()
    }
    end = None if meta.end is None or int(meta.end) == dbn.UNDEF_TIMESTAMP else int(meta.end)
    info = DbnFile(
        path=path,
        schema=str(meta.schema),
        dataset=str(meta.dataset),
        version=int(meta.version),
        stype_in=str(meta.stype_in) if meta.stype_in is not None else "mixed",
        symbols=tuple(meta.symbols),
        start=int(meta.start),
        end=end,
        mappings=mappings,
    )
    validate.check_metadata(info)
    return info


def _instrument_id(path: Path, raw: str, value: str) -> int:
    try:
        return int(value)
    except ValueError as exc:
        raise DataError(path, f"metadata.mappings[{raw!r}]: symbol {value!r} is not an instrument_id") from exc


def require_schema(info: DbnFile, expected: str | tuple[str, ...] = SUPPORTED_SCHEMAS) -> None:
    """Refuse files whose metadata schema is not the one this step needs."""
    allowed = (expected,) if isinstance(expected, str) else expected
    if info.schema not in allowed:
        raise DataError(info.path, f"metadata.schema is {info.schema!r}; expected {' or '.join(allowed)}")


def discover(directory: str | Path, schema: str | None = None, symbol: str | None = None) -> list[DbnFile]:
    """All DBN files under `directory` (recursively), checked as a set and in time order.

    With `schema`, files of the other supported schema are skipped (a symbol directory holds both
    MBP-10 and OHLCV-1m), but a file of an unsupported schema is an error: it should not be there.
    The set must hold one product (`symbol`, when given) from its dataset, no content twice and no two
    files of a schema whose records overlap in time. Files are ordered by their records' time: metadata
    ranges that do not meet order the files as their records do (each record is checked to lie in its
    file's range), and files whose metadata ranges meet are scanned for their first and last record.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(directory, "data directory does not exist")
    files = [read_info(p) for p in sorted(directory.rglob("*")) if is_dbn_path(p)]
    for info in files:
        require_schema(info)
    if schema is not None:
        files = [f for f in files if f.schema == schema]
    if not files:
        what = f"{schema} " if schema else ""
        raise DataError(directory, f"no {what}DBN files (*.dbn, *.dbn.zst) found")
    validate.check_products(directory, files, None if symbol is None else product(symbol))
    validate.check_duplicates(files)
    suspects = validate.metadata_overlaps(files)
    ranges = {f.path: scan(f) for f in files if f.path in suspects}
    validate.check_overlaps([f for f in files if f.path in suspects], ranges)
    return sorted(files, key=lambda f: (ranges[f.path].first_ts if f.path in ranges else f.start, str(f.path)))


def record_dtype(info: DbnFile) -> np.dtype:
    """The record layout of the file's schema in its own DBN version (definitions differ between versions)."""
    name = RECORD_CLASSES.get(info.schema)
    if name is None or (info.version < 3 and info.schema in V3_ONLY_SCHEMAS):
        raise DataError(info.path, f"metadata.schema {info.schema!r} has no known record layout")
    module = {1: dbn.v1, 2: dbn.v2}.get(info.version, dbn)
    return np.dtype(getattr(module, name)._dtypes)


def iter_records(info: DbnFile, chunk_records: int | None = None,
                 checks: RecordChecks | None = None) -> Iterator[np.ndarray]:
    """Yield the file's records as structured-array chunks of at most `chunk_records` rows (default: about
    DEFAULT_CHUNK_BYTES).

    Each chunk has passed `checks` (a fresh `RecordChecks` unless one is given, e.g. to read its range).
    """
    dtype = record_dtype(info)
    checks = checks or RecordChecks(info, dtype)
    want = dtype.itemsize * max(int(chunk_records or DEFAULT_CHUNK_BYTES // dtype.itemsize), 1)
    try:
        with _payload(info) as reader:
            while buffer := _read_full(reader, want):
                chunk = np.frombuffer(buffer, dtype=dtype, count=len(buffer) // dtype.itemsize)
                checks(chunk)  # first: records of another layout are named as such, not as a cut-off file
                if loose := len(buffer) % dtype.itemsize:
                    raise DataError(info.path, f"file is truncated: {loose} bytes of an incomplete record "
                                               f"after record {checks.count}")
                yield chunk
                if len(buffer) < want:
                    break
    except (zstandard.ZstdError, OSError) as exc:
        raise DataError(info.path, f"record data is corrupt or unreadable ({exc})") from exc


class _payload:
    """The decompressed stream of a DBN file, positioned after its metadata (zstd detected by its magic)."""

    def __init__(self, info: DbnFile) -> None:
        self.info = info

    def __enter__(self):
        path = self.info.path
        self._fh = path.open("rb")
        try:
            if int.from_bytes(self._fh.read(4), "little") == _ZSTD_MAGIC:
                check_zstd_complete(path)
                self._fh.seek(0)
                reader = zstandard.ZstdDecompressor().stream_reader(self._fh, read_across_frames=True)
            else:
                self._fh.seek(0)
                reader = self._fh
            head = _read_full(reader, 8)
            if len(head) < 8 or head[:3] != b"DBN":
                raise DataError(path, "not a valid DBN file: no DBN header")
            meta_len = int.from_bytes(head[4:8], "little")
            if len(_read_full(reader, meta_len)) != meta_len:
                raise DataError(path, "file is truncated inside its metadata")
            return reader
        except BaseException:
            self._fh.close()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self._fh.close()


def _read_full(reader, n: int) -> bytes:
    """Up to `n` bytes, fewer only at the end of the stream (a zstd reader may return short reads)."""
    parts, got = [], 0
    while got < n:
        part = reader.read(n - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def count_records(info: DbnFile) -> int:
    return sum(len(chunk) for chunk in iter_records(info))


def scan(info: DbnFile) -> RecordRange:
    """Read the whole file through the record checks; its record count and index-time range."""
    checks = RecordChecks(info, record_dtype(info))
    for _ in iter_records(info, checks=checks):
        pass
    return checks.result()


# --- zstd completeness --------------------------------------------------------------------------

_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MASK, _SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50


def check_zstd_complete(path: Path) -> None:
    """Walk the zstd frames of `path` by their block headers and fail if the stream is cut off.

    Reads a few bytes per 128 KiB block, so it costs next to nothing beside the decode itself.
    """
    size = path.stat().st_size
    with path.open("rb") as fh:
        pos = 0
        while pos < size:
            fh.seek(pos)
            magic = int.from_bytes(_read_exact(fh, 4, path), "little")
            if magic & _SKIPPABLE_MASK == _SKIPPABLE_MAGIC:
                pos += 8 + int.from_bytes(_read_exact(fh, 4, path), "little")
                continue
            if magic != _ZSTD_MAGIC:
                raise DataError(path, f"zstd stream is corrupt: bad frame magic at byte {pos}")
            descriptor = _read_exact(fh, 1, path)[0]
            fcs_flag, single_segment = descriptor >> 6, (descriptor >> 5) & 1
            has_checksum, dict_flag = (descriptor >> 2) & 1, descriptor & 3
            header = (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
            header += (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
            pos += 5 + header
            while True:
                fh.seek(pos)
                block = int.from_bytes(_read_exact(fh, 3, path), "little")
                last, kind, block_size = block & 1, (block >> 1) & 3, block >> 3
                if kind == 3:
                    raise DataError(path, f"zstd stream is corrupt: reserved block type at byte {pos}")
                pos += 3 + (1 if kind == 1 else block_size)
                if last:
                    break
            pos += 4 if has_checksum else 0
        if pos > size:
            raise DataError(path, f"zstd stream is truncated: ends at byte {size}, frame needs {pos}")


def _read_exact(fh, n: int, path: Path) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise DataError(path, "zstd stream is truncated (file ends inside a frame header)")
    return data
