"""Predecoded sidecars: the feature-engineered form of one DBN file, built once, memory-mapped after.

A sidecar is a directory `{stem}.{ROOT}.{kind}.{key}/` holding one `.npy` per array and a
`meta.json`. The key hashes the source file's content, the feature version, the product and the
label settings, so a changed file, a new feature version or other labels never reuse an old
sidecar. It is written into a temporary directory and renamed into place in one step: readers see
a complete sidecar or none. On load the meta and every array's dtype and shape are verified; a
corrupt sidecar is rebuilt, and older sidecars of the same file (stale keys) are removed.
"""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import alpha_core
from alpha_core.atomic import atomic_directory, remove_stale_temporaries
from alpha_core.data.dbn import MBP10, OHLCV_1M, DbnFile, read_info, require_schema
from alpha_core.data.products import Product, product
from alpha_core.data.validate import CHECKS_VERSION
from alpha_core.errors import DataError
from alpha_core.hashing import file_sha256

FEATURE_VERSION = "2"  # bump whenever a feature or label changes: old sidecars become stale
BOOK, BARS = "book", "bars"
Kind = Literal["book", "bars"]
KIND_OF_SCHEMA = {MBP10: BOOK, OHLCV_1M: BARS}
DEFAULT_HORIZONS = {BOOK: (10, 100, 1000), BARS: (5, 15, 60)}
HORIZON_UNIT = {BOOK: "snapshots", BARS: "minutes"}
ARRAYS = ("features", "ts", "price", "dt", "trade_ts", "labels", "outcome_long", "outcome_short", "instrument_id")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LabelConfig(Strict):
    """Label settings; `None` fields take the defaults of the kind and product."""

    horizons: tuple[int, ...] | None = None
    outcome_label_cost: float | None = Field(default=None, ge=0.0)

    def resolve(self, kind: str, prod: Product) -> tuple[tuple[int, ...], float]:
        horizons = self.horizons or DEFAULT_HORIZONS[kind]
        if any(h <= 0 for h in horizons) or list(horizons) != sorted(set(horizons)):
            raise DataError(None, f"horizons must be positive and increasing, got {list(horizons)}")
        cost = prod.default_cost if self.outcome_label_cost is None else self.outcome_label_cost
        return tuple(horizons), float(cost)


class ArraySpec(Strict):
    dtype: str
    shape: list[int]


class SourceInfo(Strict):
    name: str
    path: str
    sha256: str
    size: int
    schema_: str = Field(alias="schema")
    dataset: str
    dbn_version: int
    metadata_symbols: list[str]


class RollInfo(Strict):
    session: str
    from_contract: str
    to_contract: str


class SidecarMeta(Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    format: Literal["alpha-sidecar"] = "alpha-sidecar"
    feature_version: str
    key: str
    kind: Kind
    symbol: str
    tick_size: float
    source: SourceInfo
    feature_names: list[str]
    horizons: list[int]
    horizon_unit: str
    outcome_label_cost: float
    price_note: str = "price: front-month mid (book) or close (bars), stitched at rolls"
    rows: int
    first_ts: int
    last_ts: int
    first_time: str
    last_time: str
    contracts: dict[str, int]
    roll_dates: list[RollInfo]
    dropped: dict[str, int]
    arrays: dict[str, ArraySpec]
    alpha_version: str


class SidecarCorrupt(Exception):
    """A sidecar directory that cannot be trusted (missing/invalid meta or array)."""


@dataclass
class Sidecar:
    """A loaded sidecar; arrays are read-only memory maps."""

    path: Path
    meta: SidecarMeta
    features: np.ndarray  # float32 [N, F]
    ts: np.ndarray  # int64 [N] (ts_recv for the book, bar start for bars)
    price: np.ndarray  # float64 [N] stitched reference price
    dt: np.ndarray  # float32 [N] seconds since the previous row
    # int64 [N] the close-trade clock: book, the ts_event of the latest front-month trade received at or
    # before this snapshot (file order; -1 before the first), so the snapshot a decision at a bar's close
    # trade may read is known; bars, the bar's upper bound ts + 60 s - 1 ns
    trade_ts: np.ndarray
    labels: np.ndarray  # float32 [N, H] direction (1 up, 0 not up, NaN where `labels.py` says no price is known)
    outcome_long: np.ndarray  # float32 [N, H] price units, net of cost
    outcome_short: np.ndarray
    instrument_id: np.ndarray  # uint32 [N]

    @property
    def rows(self) -> int:
        return self.meta.rows


def resolve_product(info: DbnFile, symbol: str | None) -> Product:
    """The product to extract: the given symbol, else the single product the file's metadata maps."""
    roots = info.products()
    if symbol is not None:
        prod = product(symbol)
        if prod.root not in roots:
            found = ", ".join(sorted(roots)) or "none"
            raise DataError(info.path, f"metadata maps no {prod.symbol} contracts (products found: {found})")
        return prod
    if len(roots) != 1:
        found = ", ".join(sorted(roots)) or "none"
        raise DataError(info.path, f"metadata maps several or no products ({found}); pass a symbol")
    return product(next(iter(roots)))


def sidecar_key(sha256: str, kind: str, prod: Product, horizons: tuple[int, ...], cost: float) -> str:
    """Content hash, never the file name: two different files named alike keep their own sidecars."""
    ident = json.dumps([sha256, kind, prod.symbol, FEATURE_VERSION, CHECKS_VERSION, list(horizons), cost])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".dbn.zst", ".dbn"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def ensure_sidecar(
    dbn_path: str | Path,
    predecoded_dir: str | Path,
    symbol: str | None = None,
    label_config: LabelConfig | None = None,
) -> tuple[Sidecar, str]:
    """Return the sidecar of `dbn_path`, building it on a miss. Status: built | reused | rebuilt.

    The directory is `{stem}.{ROOT}.{kind}.{key}`: the stem keeps it readable, the key (content hash)
    decides reuse. An older key is evicted only when its meta names this same file path, so two files
    of one name in different folders never evict each other. Failures to write the cache are one
    DataError naming the cache directory.
    """
    info = read_info(dbn_path)
    require_schema(info)
    kind = KIND_OF_SCHEMA[info.schema]
    prod = resolve_product(info, symbol)
    horizons, cost = (label_config or LabelConfig()).resolve(kind, prod)
    sha = file_sha256(info.path)
    key = sidecar_key(sha, kind, prod, horizons, cost)
    predecoded_dir = Path(predecoded_dir)
    final = predecoded_dir / f"{_stem(info.path)}.{prod.root}.{kind}.{key}"
    if predecoded_dir.exists() and not predecoded_dir.is_dir():
        raise DataError(predecoded_dir, "the sidecar cache is not a directory (a file is in the way)")
    try:
        predecoded_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(predecoded_dir)
        status = "built"
        if final.exists():
            try:
                return load_sidecar(final, expect_key=key), "reused"
            except SidecarCorrupt:
                shutil.rmtree(final)
                status = "rebuilt"
        try:
            with atomic_directory(final) as tmp:
                _write(tmp, info, kind, prod, horizons, cost, sha, key)
        except FileExistsError:  # a concurrent builder finished first; its sidecar is equivalent
            pass
    except OSError as exc:
        raise DataError(predecoded_dir, f"cannot write the sidecar of {info.name}: {_os_reason(exc)}") from exc
    if _evict_older_keys(final, info.path):
        status = "rebuilt"
    return load_sidecar(final, expect_key=key), status


def _evict_older_keys(final: Path, source: Path) -> bool:
    """Remove sidecars of the same name whose meta says they were built from `source` (an older content)."""
    prefix = final.name.rpartition(".")[0] + "."
    evicted = False
    for other in final.parent.iterdir():
        if other == final or not other.name.startswith(prefix) or not other.is_dir():
            continue
        try:
            meta = json.loads((other / "meta.json").read_text())
            built_from = meta["source"]["path"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not provably ours: another file's, or a half-read one
        if built_from == str(source.resolve()):
            shutil.rmtree(other, ignore_errors=True)
            evicted = True
    return evicted


def _os_reason(exc: OSError) -> str:
    """`no space left on device` where that is the cause (numpy reports a full disk as a short write)."""
    if exc.errno == errno.ENOSPC or "requested and" in str(exc):
        return f"no space left on device ({exc})"
    return (exc.strerror or str(exc)).lower() + (f": {exc.filename}" if exc.filename else "")


def _write(
    out: Path, info: DbnFile, kind: str, prod: Product, horizons: tuple[int, ...], cost: float, sha: str, key: str
) -> None:
    # the build stack (polars, the decoder) is imported here only: reading a sidecar needs numpy alone
    from alpha_core.data.build import build_arrays

    built = build_arrays(out, info, kind, prod, horizons, cost)
    symbols = info.outright_ids(prod.root)
    meta = SidecarMeta(
        feature_version=FEATURE_VERSION,
        key=key,
        kind=kind,
        symbol=prod.symbol,
        tick_size=prod.tick_size,
        source=SourceInfo(
            name=info.name,
            path=str(info.path.resolve()),
            sha256=sha,
            size=info.path.stat().st_size,
            schema=info.schema,
            dataset=info.dataset,
            dbn_version=info.version,
            metadata_symbols=list(info.symbols),
        ),
        feature_names=list(built.feature_names),
        horizons=list(horizons),
        horizon_unit=HORIZON_UNIT[kind],
        outcome_label_cost=cost,
        rows=built.rows,
        first_ts=built.first_ts,
        last_ts=built.last_ts,
        first_time=_iso(built.first_ts),
        last_time=_iso(built.last_ts),
        contracts={symbols[i]: c for i, c in built.contracts.items()},
        roll_dates=[RollInfo(session=r.session, from_contract=r.from_contract, to_contract=r.to_contract)
                    for r in built.rolls],
        dropped=built.dropped,
        arrays={name: ArraySpec(dtype=dtype, shape=shape) for name, (dtype, shape) in built.arrays.items()},
        alpha_version=alpha_core.__version__,
    )
    (out / "meta.json").write_text(meta.model_dump_json(indent=2, by_alias=True) + "\n")


def _iso(ts_ns: int) -> str:
    return dt.datetime.fromtimestamp(ts_ns / 1e9, tz=dt.UTC).isoformat()


def load_sidecar(path: str | Path, expect_key: str | None = None) -> Sidecar:
    """Open a sidecar directory, verifying its meta and every array; raise SidecarCorrupt if off."""
    path = Path(path)
    try:
        meta = SidecarMeta.model_validate_json((path / "meta.json").read_text())
    except (OSError, ValidationError, ValueError) as exc:
        raise SidecarCorrupt(f"{path}: meta.json missing or invalid ({exc})") from exc
    if expect_key is not None and meta.key != expect_key:
        raise SidecarCorrupt(f"{path}: key {meta.key} != expected {expect_key}")
    if meta.feature_version != FEATURE_VERSION:
        raise SidecarCorrupt(f"{path}: feature version {meta.feature_version} != {FEATURE_VERSION}")
    arrays = {}
    for name in ARRAYS:
        spec = meta.arrays.get(name)
        try:
            arr = np.load(path / f"{name}.npy", mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise SidecarCorrupt(f"{path}: {name}.npy unreadable ({exc})") from exc
        if spec is None or str(arr.dtype) != spec.dtype or list(arr.shape) != spec.shape or len(arr) != meta.rows:
            raise SidecarCorrupt(f"{path}: {name}.npy has {arr.dtype}{list(arr.shape)}, meta says {spec}")
        arrays[name] = arr
    return Sidecar(path=path, meta=meta, **arrays)
