"""Read DBN files through `databento`: metadata, bounded-memory record chunks, parent symbology.

Everything about a file (schema, dataset, symbols, time range) comes from its DBN metadata, never
from its name. Decoding is `DBNStore.to_ndarray(count=...)`, so a quarter-size file streams in
fixed-size chunks instead of materialising the whole decompressed file.

`databento` silently drops the tail of a truncated zstd stream, so `.zst` files are first checked
frame by frame (block headers only, no decompression) and a cut-off file is an error.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import databento as db
import numpy as np

from alpha_core.data.products import parse_contract
from alpha_core.errors import DataError

MBP10 = "mbp-10"
OHLCV_1M = "ohlcv-1m"
SUPPORTED_SCHEMAS = (MBP10, OHLCV_1M)
DBN_SUFFIXES = (".dbn", ".dbn.zst")
DEFAULT_CHUNK_RECORDS = 262_144  # ~96 MB of MBP-10 per chunk


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
    return path.is_file() and path.name.endswith(DBN_SUFFIXES)


def _open_store(path: Path) -> db.DBNStore:
    if not path.exists():
        raise DataError(path, "file does not exist")
    if path.stat().st_size == 0:
        raise DataError(path, "file is empty (0 bytes), not a DBN file")
    try:
        return db.DBNStore.from_file(path)
    except Exception as exc:  # databento raises BentoError/DBNError/ValueError for junk
        raise DataError(path, f"not a valid DBN file: metadata header unreadable ({exc})") from exc


def read_info(path: str | Path) -> DbnFile:
    """Decode only the metadata header of `path`."""
    path = Path(path)
    store = _open_store(path)
    meta = store.metadata
    if meta.schema is None:
        raise DataError(path, "metadata.schema is empty (mixed-schema files are not supported)")
    mappings = {
        raw: tuple(
            Interval(iv["start_date"], iv["end_date"], _instrument_id(path, raw, iv["symbol"]))
            for iv in intervals
        )
        for raw, intervals in meta.mappings.items()
    }
    return DbnFile(
        path=path,
        schema=str(meta.schema),
        dataset=str(meta.dataset),
        version=int(meta.version),
        stype_in=str(meta.stype_in) if meta.stype_in is not None else "mixed",
        symbols=tuple(meta.symbols),
        start=int(meta.start),
        end=None if meta.end is None else int(meta.end),
        mappings=mappings,
    )


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


def discover(directory: str | Path, schema: str | None = None) -> list[DbnFile]:
    """All DBN files under `directory` (recursively), ordered by metadata start time.

    With `schema`, files of the other supported schema are skipped (a symbol directory holds both
    MBP-10 and OHLCV-1m), but a file of an unsupported schema is an error: it should not be there.
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
    return sorted(files, key=lambda f: (f.start, str(f.path)))


def iter_records(info: DbnFile, chunk_records: int = DEFAULT_CHUNK_RECORDS) -> Iterator[np.ndarray]:
    """Yield the file's records as structured-array chunks of at most `chunk_records` rows."""
    compressed = info.path.name.endswith(".zst")
    if compressed:
        check_zstd_complete(info.path)
    store = _open_store(info.path)
    n_bytes = 0
    try:
        for chunk in store.to_ndarray(count=chunk_records):
            n_bytes += chunk.nbytes
            yield chunk
    except DataError:
        raise
    except Exception as exc:
        raise DataError(info.path, f"record data is corrupt ({exc})") from exc
    if not compressed:
        payload = info.path.stat().st_size - _metadata_length(info.path)
        if n_bytes != payload:
            raise DataError(info.path, f"file is truncated: {payload - n_bytes} bytes of an incomplete record")


def _metadata_length(path: Path) -> int:
    with path.open("rb") as fh:
        head = fh.read(8)
    return 8 + int.from_bytes(head[4:8], "little")


def count_records(info: DbnFile) -> int:
    return sum(len(chunk) for chunk in iter_records(info))


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
