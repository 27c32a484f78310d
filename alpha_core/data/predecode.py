"""Build (or reuse) the sidecars of every DBN file of a symbol: the `alpha predecode` step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alpha_core.data.dbn import discover
from alpha_core.data.folds import FileRef
from alpha_core.data.products import PRODUCTS, product
from alpha_core.data.sidecar import LabelConfig, Sidecar, ensure_sidecar
from alpha_core.errors import DataError


@dataclass
class Predecoded:
    sidecar: Sidecar
    status: str  # built | reused | rebuilt

    def file_ref(self) -> FileRef:
        return file_ref(self.sidecar)


def file_ref(sc: Sidecar) -> FileRef:
    """A sidecar as a fold-plan entry, with the time range of its actual rows."""
    m = sc.meta
    return FileRef(path=m.source.path, name=m.source.name, start=m.first_ts, end=m.last_ts)


def symbol_dir(data_root: str | Path, symbol: str) -> Path:
    """`{data_root}/{SYMBOL}`, the layout `alpha demo-data` writes and production mounts use."""
    prod = product(symbol)
    path = Path(data_root) / prod.symbol
    if not path.is_dir():
        present = sorted(p.name for p in Path(data_root).glob("*") if p.name in PRODUCTS)
        raise DataError(path, f"no data directory for {prod.symbol} (symbols present: {present or 'none'})")
    return path


def predecode(
    directory: str | Path,
    predecoded_dir: str | Path,
    symbol: str | None = None,
    schema: str | None = None,
    label_config: LabelConfig | None = None,
) -> list[Predecoded]:
    """Sidecars of every DBN file under `directory` (optionally one schema), in chronological order."""
    files = discover(directory, schema)
    return [
        Predecoded(*ensure_sidecar(f.path, predecoded_dir, symbol=symbol, label_config=label_config))
        for f in files
    ]
