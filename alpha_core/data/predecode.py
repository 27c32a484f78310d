"""Build (or reuse) the sidecars of every DBN file of a symbol: the `alpha predecode` step."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from alpha_core import progress
from alpha_core.data.checks import check_continuity
from alpha_core.data.dbn import discover, scan
from alpha_core.data.folds import EMBARGO_SESSIONS, PURGE_SESSIONS, FileRef, FoldPlan, Unit, calendar_units, embargo
from alpha_core.data.products import PRODUCTS, product
from alpha_core.data.sidecar import (
    LabelConfig,
    Sidecar,
    concat_sidecars,
    ensure_sidecar,
    rows_between,
    unchanged_record_ranges,
)
from alpha_core.data.validate import RecordRange, check_overlaps
from alpha_core.errors import DataError, PlanError


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
    """Sidecars of every DBN file under `directory` (optionally one schema), in chronological order.

    All or nothing: when a file fails (a hostile record is only found while its sidecar is built) or the set does
    (a price jump between consecutive files, `checks.check_continuity`), the sidecars this call built and the
    folders it created are removed again, so a failed step leaves the cache as it found it.
    """
    files = discover(directory, schema, symbol)
    cache = Path(predecoded_dir)
    new_dirs = [p for p in (cache, *cache.parents) if not p.exists()]  # deepest first
    items: list[Predecoded] = []
    try:
        for f in progress.bar(files, desc=f"predecode {symbol or Path(directory).name}", unit="file"):
            items.append(Predecoded(*ensure_sidecar(f.path, cache, symbol=symbol, label_config=label_config)))
        check_continuity([item.sidecar for item in items])
    except BaseException:
        for item in items:
            if item.status != "reused":
                shutil.rmtree(item.sidecar.path, ignore_errors=True)
        for d in new_dirs:
            with contextlib.suppress(OSError):
                d.rmdir()  # only if empty: a concurrent writer's sidecar stays
        raise
    return items


def record_refs(
    directory: str | Path, schema: str | None = None, symbol: str | None = None, predecoded_dir: str | Path | None = None
) -> dict[str, list[FileRef]]:
    """Fold-plan entries per schema with every file's records' time range: from its sidecar's meta in
    `predecoded_dir` when one was built from the file as it is now (no decoding), else from a read of its
    timestamps.

    What `alpha folds` plans from without building sidecars: the checks a time range rests on (record layout,
    time order, the metadata's range; prices are checked where they are read, when sidecars are built), and the
    same order as training's (records never overlap between files, so record ranges and sidecar rows agree).
    """
    files = discover(directory, schema, symbol)
    known = unchanged_record_ranges(predecoded_dir) if predecoded_dir is not None else {}
    ranges = {}
    for f in files:
        meta = known.get(str(f.path.resolve()))
        ranges[f.path] = (
            RecordRange(meta.count, meta.first_ts, meta.last_ts) if meta is not None else scan(f, timestamps_only=True)
        )
    check_overlaps(files, ranges)
    refs: dict[str, list[FileRef]] = {}
    for f in files:
        r = ranges[f.path]
        refs.setdefault(f.schema, []).append(FileRef(path=str(f.path), name=f.name, start=r.first_ts, end=r.last_ts))
    return refs


def unit_sidecars(unit: Unit, by_path: dict[str, Sidecar]) -> list[Sidecar]:
    """The sidecars of a calendar quarter's parts, in time order: a file wholly inside it as it is, a file that
    spans several quarters as its rows inside this one (`sidecar.rows_between`). `by_path`: source path -> sidecar."""
    out = []
    for part in unit.parts:
        sc = by_path[part.path]
        out.append(sc if part.whole else rows_between(sc, part.start, part.end))
    return out


def quarter_sidecars(sidecars: list[Sidecar], embargo_sessions: int = 0) -> dict[str, Sidecar]:
    """Quarter name ("2024-Q3") -> one sidecar of its rows (several parts concatenated, `concat_sidecars`), without
    its first `embargo_sessions` sessions (`folds.embargo`, as the plan cuts a validation and a test quarter): what
    evaluation reads a checkpoint's validation and test quarter from."""
    by_path = {sc.meta.source.path: sc for sc in sidecars}
    out = {}
    for quarter in calendar_units([file_ref(sc) for sc in sidecars]):
        try:
            u, _ = embargo(quarter, embargo_sessions)
        except PlanError:  # nothing to score in it: never a validation or test quarter of a plan this embargo made
            continue
        out[u.name] = concat_sidecars(unit_sidecars(u, by_path), u.name)
    return out


@dataclass
class FoldData:
    """One walk-forward fold with its sidecars (what a trainer needs) and the names of its quarters."""

    fold: int
    train: list[Sidecar]
    val: list[Sidecar]
    test_names: list[str]
    train_names: list[str] = field(default_factory=list)
    val_names: list[str] = field(default_factory=list)
    purge_sessions: int = 0  # the plan's: its train and val sidecars are already cut (`folds.purge`, `folds.embargo`)
    embargo_sessions: int = 0


def fold_data(plan: FoldPlan, sidecars: list[Sidecar], cv_fold: int | None = None) -> list[FoldData]:
    """The sidecars of every requested fold (all when `cv_fold` is None) of a plan made from `sidecars`."""
    by_path = {sc.meta.source.path: sc for sc in sidecars}
    folds = plan.folds if cv_fold is None else [plan.fold(cv_fold)]

    def val(units: list[Unit]) -> list[Sidecar]:
        """A quarter of one file as that file's sidecar named for the quarter: a validation score recorded on it
        names the quarter, as the evaluator reads it (`quarter_sidecars`); several files stay parts."""
        out = []
        for u in units:
            parts = unit_sidecars(u, by_path)
            out += [concat_sidecars(parts, u.name)] if len(parts) == 1 else parts
        return out

    return [
        FoldData(
            f.fold,
            [sc for u in f.train for sc in unit_sidecars(u, by_path)],
            val(f.val),
            [u.name for u in f.test],
            [u.name for u in f.train],
            [u.name for u in f.val],
            plan.purge_sessions,
            plan.embargo_sessions,
        )
        for f in folds
    ]


def walk_forward(
    directory: str | Path,
    schema: str,
    predecoded_dir: str | Path,
    symbol: str | None,
    cv_n_folds: int,
    cv_train_window: int,
    cv_fold: int | None,
    allow_untested_folds: bool = False,
    purge_sessions: int = PURGE_SESSIONS,
    embargo_sessions: int = EMBARGO_SESSIONS,
) -> list[FoldData]:
    """The sidecars of every requested fold (all folds when `cv_fold` is None) of a symbol's calendar quarters,
    purged and embargoed by the plan."""
    from alpha_core.data.folds import plan_folds

    sidecars = [item.sidecar for item in predecode(directory, predecoded_dir, symbol, schema)]
    try:
        plan = plan_folds(
            [file_ref(sc) for sc in sidecars],
            cv_n_folds,
            cv_train_window,
            allow_untested_folds,
            schema,
            purge_sessions=purge_sessions,
            embargo_sessions=embargo_sessions,
        )
    except PlanError as exc:
        raise PlanError(f"{directory}: {exc}") from exc
    return fold_data(plan, sidecars, cv_fold)


def default_predecoded_dir(explicit: Path | None, output_dir: Path) -> Path:
    """The explicit cache, else `$ALPHA_STORAGE_ROOT/predecoded`, else `{output_dir}/.predecoded`."""
    import os

    from alpha_core.storage import PREDECODED

    if explicit is not None:
        return explicit
    root = os.environ.get("ALPHA_STORAGE_ROOT")
    return Path(root, PREDECODED) if root else output_dir / ".predecoded"
