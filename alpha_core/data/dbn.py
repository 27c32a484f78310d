"""Read DBN files: metadata through `databento_dbn`, records in bounded-memory checked chunks, parent symbology.

Everything about a file (schema, dataset, symbols, time range) comes from its DBN metadata, never
from its name. Records are decoded here, not by `DBNStore.to_ndarray`, because that silently drops
an incomplete last record and stops at the first zstd frame of a multi-frame file: the stream is
read across frames in fixed-size chunks (a quarter-size file streams in bounded memory), a trailing
partial record is an error, and a cut-off zstd stream (which zstd itself would shorten silently) is
detected first. Every chunk passes `validate.RecordChecks` before anyone sees it.

Bounded before trusted (`alpha_core.bounds`): the metadata length and its layout (every count against the bytes
that hold it) are checked here before `databento_dbn` decodes the header, so no declared size makes its Rust
decoder allocate or read past the buffer (an abort or a panic); the zstd stream is read through a reader that
refuses a decompression ratio no real file has, and the record count is bounded. A sidecar build reads the file
through one open descriptor (`DbnSource`): its metadata, its hash and both passes see the same bytes, whatever
happens to the path meanwhile, and each complete pass records the sha256 of the bytes it decoded.

`databento` itself is not imported: it pulls in pandas, aiohttp and requests (about 0.7 s of CPU per
process) for what `databento_dbn` does alone here, decoding the metadata header and naming record layouts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import databento_dbn as dbn
import numpy as np
import zstandard

from alpha_core.bounds import MAX_METADATA_BYTES, MAX_RECORDS, MAX_ZSTD_RATIO, ZSTD_RATIO_FREE_BYTES, input_bound
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
    "definition": "InstrumentDefMsg",
    "imbalance": "ImbalanceMsg",
    "mbo": "MBOMsg",
    "mbp-1": "MBP1Msg",
    "mbp-10": "MBP10Msg",
    "ohlcv-1s": "OHLCVMsg",
    "ohlcv-1m": "OHLCVMsg",
    "ohlcv-1h": "OHLCVMsg",
    "ohlcv-1d": "OHLCVMsg",
    "ohlcv-eod": "OHLCVMsg",
    "statistics": "StatMsg",
    "status": "StatusMsg",
    "tbbo": "MBP1Msg",
    "trades": "TradeMsg",
    "cmbp-1": "CMBP1Msg",
    "cbbo-1s": "CBBOMsg",
    "cbbo-1m": "CBBOMsg",
    "tcbbo": "CBBOMsg",
    "bbo-1s": "BBOMsg",
    "bbo-1m": "BBOMsg",
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
    # the open file the metadata was read from (records are then read from it too), and the sha256 of the
    # header bytes decoded: a later pass that reads other header bytes is reading a changed file
    source: DbnSource | None = field(default=None, repr=False, compare=False)
    header_sha256: str = field(default="", repr=False, compare=False)

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


class DbnSource:
    """One open DBN file, read by position (`os.pread`) so that every reader has its own offset.

    Opened without blocking (a FIFO given a DBN name must not hang the reader) and checked to be a regular
    file by its descriptor. With `digests`, `digests` collects the sha256 of every complete pass over the file
    (`reader()` read to its end), so a build can prove that all its passes decoded the bytes its key hashes.
    """

    def __init__(self, path: str | Path, digests: bool = False) -> None:
        self.path = Path(path)
        self.record_digests = digests  # hash every pass (what a sidecar build proves its key by); else none
        validate.check_path(self.path)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise DataError(self.path, f"file cannot be read ({(exc.strerror or str(exc)).lower()})") from None
        self.stat = os.fstat(self.fd)  # as opened: what a sidecar records of its source
        if not stat.S_ISREG(self.stat.st_mode):
            self.close()
            raise DataError(self.path, "not a regular file (a directory, pipe, socket or device has a DBN name)")
        self.digests: list[str] = []

    @property
    def size(self) -> int:
        """The file's size now (a file rewritten in place is read as it is, and told apart by its digest)."""
        return os.fstat(self.fd).st_size

    def __enter__(self) -> DbnSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def pread(self, n: int, offset: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def reader(self) -> _SourceReader:
        return _SourceReader(self)

    def sha256(self) -> str:
        """The sha256 of the file's bytes as this descriptor reads them now."""
        h, offset = hashlib.sha256(), 0
        while block := self.pread(1 << 22, offset):
            h.update(block)
            offset += len(block)
        return h.hexdigest()


class _SourceReader:
    """A file object over a `DbnSource` from its first byte, hashing what it reads (what zstd reads from)."""

    def __init__(self, source: DbnSource) -> None:
        self.source, self.pos = source, 0
        self._hash = hashlib.sha256() if source.record_digests else None

    def read(self, n: int = -1) -> bytes:
        data = self.source.pread(n if n >= 0 else max(self.source.size - self.pos, 1 << 16), self.pos)
        self.pos += len(data)
        if self._hash is not None:
            self._hash.update(data)
        return data

    def tell(self) -> int:
        return self.pos

    def finish(self) -> None:
        """At the end of a complete pass: hash the rest of the file (nothing, after a pass that read to its end)
        and record the digest of what the pass read."""
        if self._hash is None:
            return
        while self.read(1 << 22):
            pass
        self.source.digests.append(self._hash.hexdigest())


class _Decoded:
    """The decoded stream of a DBN file (zstd detected by its magic, or the plain bytes), refusing decompression
    beyond `ALPHA_MAX_ZSTD_RATIO` after its first ZSTD_RATIO_FREE_BYTES: reads are bounded by what is asked,
    and a bomb stops within a few MB of its first compressed bytes."""

    def __init__(
        self, source: DbnSource, raw: _SourceReader, read_size: int = zstandard.DECOMPRESSION_RECOMMENDED_INPUT_SIZE
    ) -> None:
        self.path, self.raw, self.out = source.path, raw, 0
        self.compressed = int.from_bytes(source.pread(4, 0), "little") == _ZSTD_MAGIC
        self.ratio = input_bound(MAX_ZSTD_RATIO)
        self._stream = (
            zstandard.ZstdDecompressor().stream_reader(raw, read_size=read_size, read_across_frames=True)
            if self.compressed
            else raw
        )
        self.remaining = 0  # bytes after the metadata (set by `_payload`; the record count of a plain file)
        self.finish = raw.finish  # called at the end of a complete pass: records the digest of the bytes read

    def read(self, n: int) -> bytes:
        data = self._stream.read(n)
        self.out += len(data)
        if self.compressed and self.out > ZSTD_RATIO_FREE_BYTES + self.ratio * self.raw.pos:
            raise DataError(
                self.path,
                f"zstd stream decompresses to over {self.out:,} bytes from its first "
                f"{self.raw.pos:,} bytes, more than {self.ratio}x (ALPHA_MAX_ZSTD_RATIO): "
                "refused as a decompression bomb",
            )
        return data


def _read_header(source: DbnSource, decoded: _Decoded) -> tuple[int, bytes, bytes]:
    """(DBN version, the 8 prelude bytes, the metadata bytes) from the start of the decoded stream, the declared
    length bounded before anything is read or allocated from it."""
    path = source.path
    head = _read_full(decoded, 8)
    if len(head) < 8 or head[:3] != b"DBN":
        raise DataError(
            path,
            "not a valid DBN file: metadata header unreadable (no DBN header"
            f"{' after zstd decompression' if decoded.compressed else ''})",
        )
    version, length = head[3], int.from_bytes(head[4:8], "little")
    if version not in (1, 2, 3):
        raise DataError(path, f"not a valid DBN file: DBN version {version} (byte 3 of the header) is not 1, 2 or 3")
    limit = input_bound(MAX_METADATA_BYTES)
    if length > limit:
        raise DataError(
            path,
            f"metadata length is {length:,} bytes (header bytes 4-8), over the limit of {limit:,} (ALPHA_MAX_METADATA_BYTES)",
        )
    body = _read_full(decoded, length)
    if len(body) != length:
        raise DataError(path, f"file is truncated inside its metadata ({len(body):,} of {length:,} bytes)")
    check_metadata_layout(path, version, body)
    return version, head, body


_HEADER_READ_SIZE = 1 << 14  # compressed bytes read at a time for the metadata alone (it is usually a few KB)
_METADATA_FIXED = 100  # dataset .. reserved, in DBN v1, v2 and v3 alike
_V1_SYMBOL_CSTR_LEN = 22
_MAX_SYMBOL_CSTR_LEN = 1024  # v2/v3 write 71; the field is a u16


def check_metadata_layout(path: Path, version: int, body: bytes) -> None:
    """Walk the metadata as `databento_dbn` will and refuse every count or length that does not fit in `body`.

    Its decoder reads the fixed fields and each count without checking that the buffer holds them (a Rust panic
    on a short header) and sizes some allocations by the declared counts alone (an abort when they are huge):
    after this walk, every field it reads lies inside `body`. Layout: 100 fixed bytes (the symbol length, a u16
    at byte 45, from DBN v2 on; 22 in v1), the schema definition length (a u32, 0), then `symbols`, `partial`
    and `not_found` (a u32 count, then count x symbol length bytes each) and `mappings` (a u32 count; each a raw
    symbol, a u32 interval count and that many intervals of two u32 dates and a symbol).
    """
    n = len(body)

    def fail(what: str) -> DataError:
        return DataError(path, f"not a valid DBN file: metadata.{what}")

    def u32(at: int, what: str) -> int:
        if at + 4 > n:
            raise fail(f"{what} lies at bytes {at}-{at + 4}, past the end of the {n}-byte metadata")
        return struct.unpack_from("<I", body, at)[0]

    if n < _METADATA_FIXED + 4:
        raise fail(f"fixed fields need {_METADATA_FIXED + 4} bytes, the metadata length is {n}")
    cstr = _V1_SYMBOL_CSTR_LEN if version == 1 else struct.unpack_from("<H", body, 45)[0]
    if not 1 <= cstr <= _MAX_SYMBOL_CSTR_LEN:
        raise fail(f"symbol_cstr_len is {cstr} (bytes 45-47), not in [1, {_MAX_SYMBOL_CSTR_LEN}]")
    definition = u32(_METADATA_FIXED, "schema_definition_length")
    if definition:
        raise fail(f"schema_definition_length is {definition} (schema definitions are not supported)")
    pos = _METADATA_FIXED + 4
    for name in ("symbols", "partial", "not_found"):
        count = u32(pos, f"{name} count")
        pos += 4
        if count * cstr > n - pos:
            raise fail(f"{name} declares {count:,} symbols of {cstr} bytes, only {n - pos:,} bytes remain")
        pos += count * cstr
    count = u32(pos, "mappings count")
    pos += 4
    if count * (cstr + 4) > n - pos:
        raise fail(f"mappings declares {count:,} mappings (at least {cstr + 4} bytes each), only {n - pos:,} bytes remain")
    interval = 8 + cstr
    for i in range(count):
        intervals = u32(pos + cstr, f"mappings[{i}] interval count")
        pos += cstr + 4
        if intervals * interval > n - pos:
            raise fail(f"mappings[{i}] declares {intervals:,} intervals of {interval} bytes, only {n - pos:,} bytes remain")
        pos += intervals * interval


def _decode_metadata(path: Path, head: bytes, body: bytes) -> dbn.Metadata:
    try:
        return dbn.Metadata.decode(head + body, upgrade_policy=dbn.VersionUpgradePolicy.AS_IS)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # DBN errors; a Rust panic (pyo3's PanicException is a BaseException) too
        raise DataError(path, f"not a valid DBN file: metadata header unreadable ({_first_line(exc)})") from exc


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def read_info(path: str | Path | DbnSource) -> DbnFile:
    """Decode only the metadata header of `path`. Given an open `DbnSource`, the returned file reads its records
    through that descriptor too."""
    if isinstance(path, DbnSource):
        return _read_info(path, keep=True)
    with DbnSource(path) as source:
        return _read_info(source, keep=False)


def _read_info(source: DbnSource, keep: bool) -> DbnFile:
    path = source.path
    if source.size == 0:
        raise DataError(path, "file is empty (0 bytes), not a DBN file")
    try:
        _, head, body = _read_header(source, _Decoded(source, source.reader(), read_size=_HEADER_READ_SIZE))
    except (zstandard.ZstdError, OSError) as exc:  # junk that is not zstd, or an unreadable file
        raise DataError(path, f"not a valid DBN file: metadata header unreadable ({exc})") from exc
    meta = _decode_metadata(path, head, body)
    try:  # the binding converts lazily: a date of year 0 fails here, not in the decoder
        schema, mapped = meta.schema, meta.mappings
        end = None if meta.end is None or int(meta.end) == dbn.UNDEF_TIMESTAMP else int(meta.end)
        fields = dict(
            dataset=str(meta.dataset),
            version=int(meta.version),
            symbols=tuple(meta.symbols),
            stype_in=str(meta.stype_in) if meta.stype_in is not None else "mixed",
            start=int(meta.start),
        )
    except (ValueError, TypeError, OverflowError) as exc:
        raise DataError(path, f"not a valid DBN file: metadata header unreadable ({_first_line(exc)})") from exc
    if schema is None:
        raise DataError(path, "metadata.schema is empty (mixed-schema files are not supported)")
    mappings = {
        raw: tuple(Interval(iv["start_date"], iv["end_date"], _instrument_id(path, raw, iv["symbol"])) for iv in intervals)
        for raw, intervals in mapped.items()
    }
    info = DbnFile(
        path=path,
        schema=str(schema),
        end=end,
        mappings=mappings,
        **fields,
        source=source if keep else None,
        header_sha256=hashlib.sha256(head + body).hexdigest(),
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
    The set must hold one product (`symbol`, when given) from its dataset, no content twice, no stray file
    (far outside the others' range, or a tiny sample among full files: `validate.check_strays`) and no two
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
    validate.check_strays(files)
    suspects = validate.metadata_overlaps(files)
    ranges = {f.path: scan(f, timestamps_only=True) for f in files if f.path in suspects}
    validate.check_overlaps([f for f in files if f.path in suspects], ranges)
    return sorted(files, key=lambda f: (ranges[f.path].first_ts if f.path in ranges else f.start, str(f.path)))


def record_dtype(info: DbnFile) -> np.dtype:
    """The record layout of the file's schema in its own DBN version (definitions differ between versions)."""
    name = RECORD_CLASSES.get(info.schema)
    if name is None or (info.version < 3 and info.schema in V3_ONLY_SCHEMAS):
        raise DataError(info.path, f"metadata.schema {info.schema!r} has no known record layout")
    module = {1: dbn.v1, 2: dbn.v2}.get(info.version, dbn)
    return np.dtype(getattr(module, name)._dtypes)


def iter_records(info: DbnFile, chunk_records: int | None = None, checks: RecordChecks | None = None) -> Iterator[np.ndarray]:
    """Yield the file's records as structured-array chunks of at most `chunk_records` rows (default: about
    DEFAULT_CHUNK_BYTES).

    Each chunk has passed `checks` (a fresh `RecordChecks` unless one is given, e.g. to read its range). More
    than `ALPHA_MAX_RECORDS` records is an error. Read to its end, the pass records the sha256 of the bytes it
    decoded in `info.source.digests` (when the file was opened as a `DbnSource`).
    """
    dtype = record_dtype(info)
    checks = checks or RecordChecks(info, dtype)
    want = dtype.itemsize * max(int(chunk_records or DEFAULT_CHUNK_BYTES // dtype.itemsize), 1)
    limit = input_bound(MAX_RECORDS)
    try:
        with _payload(info) as reader:
            if not reader.compressed and (declared := reader.remaining // dtype.itemsize) > limit:
                raise DataError(
                    info.path, f"file holds {declared:,} records, more than the limit of {limit:,} (ALPHA_MAX_RECORDS)"
                )
            while buffer := _read_full(reader, want):
                chunk = np.frombuffer(buffer, dtype=dtype, count=len(buffer) // dtype.itemsize)
                checks(chunk)  # first: records of another layout are named as such, not as a cut-off file
                if loose := len(buffer) % dtype.itemsize:
                    raise DataError(
                        info.path, f"file is truncated: {loose} bytes of an incomplete record after record {checks.count}"
                    )
                if checks.count > limit:
                    raise DataError(
                        info.path, f"record {limit:,}: more records than the limit of {limit:,} (ALPHA_MAX_RECORDS)"
                    )
                yield chunk
                if len(buffer) < want:
                    break
            reader.finish()
    except (zstandard.ZstdError, OSError) as exc:
        raise DataError(info.path, f"record data is corrupt or unreadable ({exc})") from exc


class _payload:
    """The decoded stream of a DBN file, positioned after its metadata: read from the file's own `DbnSource`
    when it has one (else one opened for this pass), zstd detected by its magic and checked to be complete."""

    def __init__(self, info: DbnFile) -> None:
        self.info = info

    def __enter__(self) -> _Decoded:
        info = self.info
        self._own = None if info.source is not None else DbnSource(info.path)
        source = info.source or self._own
        try:
            raw = source.reader()
            decoded = _Decoded(source, raw)
            if decoded.compressed:
                check_zstd_complete(source)
            _, head, body = _read_header(source, decoded)
            if info.header_sha256 and hashlib.sha256(head + body).hexdigest() != info.header_sha256:
                raise DataError(info.path, "the file changed while it was read (its metadata is not the one read before)")
            decoded.remaining = source.size - 8 - len(body)
            return decoded
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own is not None:
            self._own.close()


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


def scan(info: DbnFile, timestamps_only: bool = False) -> RecordRange:
    """Read the whole file through the record checks; its record count and index-time range.

    `timestamps_only` runs only the checks that the range rests on (record layout, time order, the metadata's
    range): what a fold plan needs, at about the cost of decompressing the file."""
    checks = RecordChecks(info, record_dtype(info), timestamps_only=timestamps_only)
    for _ in iter_records(info, checks=checks):
        pass
    return checks.result()


# --- zstd completeness --------------------------------------------------------------------------

_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MASK, _SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50


def check_zstd_complete(source: DbnSource) -> None:
    """Walk the zstd frames of the file by their block headers and fail if the stream is cut off.

    Reads a few bytes per 128 KiB block, so it costs next to nothing beside the decode itself.
    """
    size, path = source.size, source.path

    def read_exact(n: int, at: int) -> bytes:
        data = source.pread(n, at)
        if len(data) != n:
            raise DataError(path, "zstd stream is truncated (file ends inside a frame header)")
        return data

    pos = 0
    while pos < size:
        magic = int.from_bytes(read_exact(4, pos), "little")
        if magic & _SKIPPABLE_MASK == _SKIPPABLE_MAGIC:
            pos += 8 + int.from_bytes(read_exact(4, pos + 4), "little")
            continue
        if magic != _ZSTD_MAGIC:
            raise DataError(path, f"zstd stream is corrupt: bad frame magic at byte {pos}")
        descriptor = read_exact(1, pos + 4)[0]
        fcs_flag, single_segment = descriptor >> 6, (descriptor >> 5) & 1
        has_checksum, dict_flag = (descriptor >> 2) & 1, descriptor & 3
        header = (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
        header += (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
        pos += 5 + header
        while True:
            block = int.from_bytes(read_exact(3, pos), "little")
            last, kind, block_size = block & 1, (block >> 1) & 3, block >> 3
            if kind == 3:
                raise DataError(path, f"zstd stream is corrupt: reserved block type at byte {pos}")
            pos += 3 + (1 if kind == 1 else block_size)
            if last:
                break
        pos += 4 if has_checksum else 0
    if pos > size:
        raise DataError(path, f"zstd stream is truncated: ends at byte {size}, frame needs {pos}")
