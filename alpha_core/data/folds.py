"""Walk-forward fold plans over a symbol's calendar quarters: one plan for every door.

A plan counts calendar quarters, not files: a symbol's files of one schema are grouped into quarters by
their records' time range (`calendar_units`), whatever the split Databento delivered (daily, weekly, monthly,
quarterly, or one file for two years), and a file whose records run over several quarters gives each its part
(the rows of its sidecar inside the quarter, `predecode.unit_sidecars`). A quarter is named `2024-Q3`; a record
belongs to the quarter of its UTC date (its `ts_recv`, or `ts_event` for bars), where Databento splits a
download and `alpha fetch` its quarters, so the quarterly files `alpha fetch` writes are whole quarters (the first
hours of a quarter's first session, which opens the evening before in Chicago, belong to the quarter before, as
in Databento's files). `train_files`, `val_files` and `test_files` of every summary name quarters.

- `cv_n_folds > 1` (the default, `N_FOLDS`, the number of fold partitions Dagster trains): a sliding window
  of W training quarters; fold k trains on quarters [k, k+W), validates on quarter k+W and is tested on
  quarter k+W+1. W is `cv_train_window`, or, when 0, `n_units - cv_n_folds - 1` (room for a validation and a
  test quarter after every fold). A fold without a test quarter is a PlanError unless `allow_untested_folds`
  (then a warning).
- `cv_n_folds == 1`, an explicit opt-in: the single train/validation split (every quarter but the last trains,
  the last validates). It has no test quarter, so nothing it trains is tested out of sample: it warns.

Gaps (a quarter missing between the first and the last, weekday sessions without records inside a quarter)
are reported in the plan (`gaps`), by `alpha folds` and in the fold plans' metadata; plans of two schemas of one
symbol whose quarters differ are refused (`check_schemas_agree`).

The CLI trainers, `alpha hyperopt`, `alpha folds`, `alpha evaluate` and the Dagster assets all default to
`N_FOLDS` and the same window rule, so the original system's commands and `alpha run` plan the same folds.

Train, validation and test never share a quarter, and labels are computed per file and cut at a quarter's
end (NaN past it), so no sample or label horizon crosses a split boundary. `check_leakage` proves both, and
`hyperopt_leakage` proves that a hyperparameter search touched no test quarter (`hyperopt_files`).
"""

from __future__ import annotations

import datetime as dt
import warnings
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from alpha_core.data.front_month import cme_holidays
from alpha_core.errors import PlanError
from alpha_core.sessions import session_day, session_open_ns

N_FOLDS = 3  # walk-forward folds per symbol, each with a test quarter: the default of every door
MAX_LISTED = 5  # dates listed in one gap line
NS_PER_DAY = 86_400 * 1_000_000_000
SESSION_MIDDLE_NS = 19 * 3_600_000_000_000  # 17:00 CT the evening before + 19 h = 12:00 CT: inside every session


class FileRef(BaseModel):
    """One file with its records' time range: what quarters are made of."""

    model_config = ConfigDict(extra="forbid")

    path: str
    name: str
    start: int  # ns, metadata start (or first row)
    end: int  # ns, last row / metadata end


class Part(BaseModel):
    """A file's records inside one quarter: the whole file, or the rows of [start, end] of a longer one."""

    model_config = ConfigDict(extra="forbid")

    path: str
    name: str
    start: int  # ns, the first record of the file inside the quarter (or the session open)
    end: int  # ns, the last record inside the quarter (or the last ns before the next quarter)
    whole: bool  # the file lies wholly in this quarter (its sidecar is used as it is)


class Unit(BaseModel):
    """A calendar quarter of one schema of one symbol: what a fold trains, validates or tests on."""

    model_config = ConfigDict(extra="forbid")

    name: str  # "2024-Q3"
    start: int  # ns, the first record
    end: int  # ns, the last record
    parts: list[Part]


class Fold(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fold: int
    train: list[Unit]
    val: list[Unit]
    test: list[Unit]


class FoldPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cv_n_folds: int
    cv_train_window: int  # as requested (0 = derived)
    window: int  # resolved number of training quarters per fold
    n_files: int
    n_units: int  # calendar quarters
    schema_name: str | None = None  # the schema planned (None: not said)
    units: list[str]  # every quarter, in time order
    gaps: list[str]  # missing quarters, sessions without records inside a quarter
    folds: list[Fold]

    def fold(self, k: int) -> Fold:
        if not 0 <= k < len(self.folds):
            raise PlanError(f"--cv-fold {k} must be < --cv-n-folds {self.cv_n_folds}")
        return self.folds[k]


class UntestedFoldWarning(UserWarning):
    """A plan with a fold that has no test quarter: what that fold trains is never scored out of sample."""


# --- calendar quarters ------------------------------------------------------------------------------------


def quarter_of(day: dt.date) -> tuple[int, int]:
    return day.year, (day.month - 1) // 3 + 1


def quarter_name(year: int, q: int) -> str:
    return f"{year}-Q{q}"


def _next(year: int, q: int) -> tuple[int, int]:
    return (year + 1, 1) if q == 4 else (year, q + 1)


def _utc_day(ts_ns: int) -> dt.date:
    return dt.date(1970, 1, 1) + dt.timedelta(days=ts_ns // NS_PER_DAY)


def _midnight(day: dt.date) -> int:
    return (day - dt.date(1970, 1, 1)).days * NS_PER_DAY


def quarter_bounds(year: int, q: int) -> tuple[int, int]:
    """[00:00 UTC of its first day, 00:00 UTC of the next quarter's) in ns: Databento's split, and `alpha fetch`'s."""
    ny, nq = _next(year, q)
    return _midnight(dt.date(year, 3 * q - 2, 1)), _midnight(dt.date(ny, 3 * nq - 2, 1))


def calendar_units(files: list[FileRef]) -> list[Unit]:
    """The calendar quarters of one schema's files, in time order, each with the part of every file inside it."""
    parts: dict[tuple[int, int], list[Part]] = {}
    for f in sorted(files, key=lambda f: (f.start, f.path)):
        first, last = quarter_of(_utc_day(f.start)), quarter_of(_utc_day(f.end))
        q = first
        while q <= last:
            lo, hi = quarter_bounds(*q)
            start, end = max(f.start, lo), min(f.end, hi - 1)
            parts.setdefault(q, []).append(Part(path=f.path, name=f.name, start=start, end=end, whole=first == last))
            q = _next(*q)
    return [
        Unit(name=quarter_name(*q), start=min(p.start for p in ps), end=max(p.end for p in ps), parts=ps)
        for q, ps in sorted(parts.items())
    ]


def calendar_gaps(units: list[Unit], schema: str | None = None) -> list[str]:
    """Quarters missing between the first and the last, and weekday sessions (CME holidays aside) between a
    quarter's first and last session whose middle no file's records reach (a daily file's last hours open the
    next session: a session counts where its 12:00 CT is covered): one line each, naming the schema."""
    what = f"{schema} " if schema else ""
    gaps = []
    have = {u.name for u in units}
    if units:
        q = quarter_of(_utc_day(units[0].start))
        while quarter_name(*q) != units[-1].name:
            if quarter_name(*q) not in have:
                gaps.append(f"{quarter_name(*q)}: no {what}files (a missing quarter: the folds step over it)")
            q = _next(*q)
    for u in units:
        covered: set[dt.date] = set()  # sessions whose middle (12:00 CT) lies inside some part's records
        for p in u.parts:
            d, last = session_day(p.start), session_day(p.end)
            while d <= last:
                if p.start <= session_open_ns(d) + SESSION_MIDDLE_NS <= p.end:
                    covered.add(d)
                d += dt.timedelta(days=1)
        if not covered:
            continue
        first, last = min(covered), max(covered)
        off = cme_holidays(first.year) | cme_holidays(last.year)
        days = (first + dt.timedelta(days=i) for i in range((last - first).days + 1))
        missing = [d for d in days if d.weekday() < 5 and d not in off and d not in covered]
        if missing:
            shown = ", ".join(map(str, missing[:MAX_LISTED])) + (", ..." if len(missing) > MAX_LISTED else "")
            gaps.append(f"{u.name}: no {what}records in {len(missing)} weekday session(s) inside the quarter ({shown})")
    return gaps


def check_schemas_agree(files: dict[str, list[FileRef]]) -> None:
    """One symbol's schemas (schema -> its files) must cover the same calendar quarters, checked before any plan:
    models of each schema are compared and ensembled test quarter by test quarter. A PlanError names the schema
    and the quarter it lacks."""
    if len(files) < 2:
        return
    have = {schema: [u.name for u in calendar_units(refs)] for schema, refs in files.items()}
    every = sorted({u for units in have.values() for u in units})
    for schema, units in sorted(have.items()):
        lacking = [u for u in every if u not in units]
        if lacking:
            others = ", ".join(s for s, us in sorted(have.items()) if s != schema and lacking[0] in us)
            raise PlanError(
                f"{schema} has no files for {', '.join(lacking)} ({others} has): the schemas' fold plans would "
                f"disagree; add the {schema} files of {lacking[0]} or remove the other schemas' files of it"
            )


def _quarters(n: int) -> str:
    return f"{n} quarter{'s' if n != 1 else ''}"


def plan_folds(
    files: list[FileRef],
    cv_n_folds: int = N_FOLDS,
    cv_train_window: int = 0,
    allow_untested_folds: bool = False,
    schema: str | None = None,
) -> FoldPlan:
    """Plan every fold over the files' calendar quarters; a layout that does not fit is a PlanError naming the
    schema and the numbers."""
    if cv_n_folds < 1:
        raise PlanError(f"--cv-n-folds must be >= 1 (got {cv_n_folds})")
    if cv_train_window < 0:
        raise PlanError(f"--cv-train-window must be >= 0 (got {cv_train_window})")
    units = calendar_units(files)
    n = len(units)
    what = f"{schema}: " if schema else ""
    found = f"{_quarters(n)} ({', '.join(u.name for u in units) or 'no files'})"
    common = dict(
        cv_train_window=cv_train_window,
        n_files=len({f.path for f in files}),
        n_units=n,
        schema_name=schema,
        units=[u.name for u in units],
        gaps=calendar_gaps(units, schema),
    )
    if cv_n_folds == 1:
        if n < 2:
            raise PlanError(
                f"{what}need >= 2 calendar quarters for a single-fold temporal split, found {found}: a fold trains on "
                f"whole quarters"
            )
        folds = [Fold(fold=0, train=units[:-1], val=[units[-1]], test=[])]
        warnings.warn(
            "--cv-n-folds 1 is the single train/validation split: it has no test quarter, so nothing it "
            "trains is evaluated out of sample",
            UntestedFoldWarning,
            stacklevel=2,
        )
        return FoldPlan(cv_n_folds=1, window=n - 1, folds=folds, **common)
    window = cv_train_window if cv_train_window > 0 else max(n - cv_n_folds - 1, 0)
    if window < 1:
        raise PlanError(
            f"{what}{found} {'are' if n != 1 else 'is'} too few for {cv_n_folds} walk-forward folds (each needs a "
            f"training, a validation and a test quarter: at least {cv_n_folds + 2} calendar quarters); lower "
            f"--cv-n-folds, or pass --cv-n-folds 1 for a single train/validation split without a test quarter"
        )
    last = cv_n_folds - 1
    if last + window + 1 > n:
        raise PlanError(
            f"{what}CV layout overflows: cv_fold={last} + window={window} + 1 val quarter > {_quarters(n)} available"
        )
    untested = [k for k in range(cv_n_folds) if k + window + 1 >= n]
    if untested and not allow_untested_folds:
        raise PlanError(
            f"{what}fold(s) {', '.join(map(str, untested))} would have no test quarter: {cv_n_folds} folds x window "
            f"{window} need {_quarters(cv_n_folds + window + 1)}, {n} available (lower --cv-train-window or "
            f"--cv-n-folds, or pass --allow-untested-folds)"
        )
    if untested:
        warnings.warn(
            f"{what}fold(s) {', '.join(map(str, untested))} have no test quarter ({_quarters(n)}, {cv_n_folds} folds, "
            f"window {window}): they are trained but never evaluated",
            UntestedFoldWarning,
            stacklevel=2,
        )
    folds = []
    for k in range(cv_n_folds):
        val_idx = k + window
        test = [units[val_idx + 1]] if val_idx + 1 < n else []
        folds.append(Fold(fold=k, train=units[k:val_idx], val=[units[val_idx]], test=test))
    return FoldPlan(cv_n_folds=cv_n_folds, window=window, folds=folds, **common)


def check_leakage(plan: FoldPlan) -> list[str]:
    """Problems with a plan: a quarter (or a file's part) in two splits, or splits whose time ranges are not
    strictly ordered."""
    problems = []
    for fold in plan.folds:
        splits = {"train": fold.train, "val": fold.val, "test": fold.test}
        seen: dict[str, str] = {}
        for split, refs in splits.items():
            for ref in refs:
                keys = [ref.name] + [f"{Path(p.path).resolve()}@{p.start}" for p in ref.parts]
                for key in keys:
                    if key in seen:
                        problems.append(f"fold {fold.fold}: {ref.name} is in both {seen[key]} and {split}")
                        break
                for key in keys:
                    seen[key] = split
        ordered = [(s, refs) for s, refs in splits.items() if refs]
        for (a, ra), (b, rb) in zip(ordered, ordered[1:], strict=False):
            if max(r.end for r in ra) >= min(r.start for r in rb):
                problems.append(f"fold {fold.fold}: {a} data reaches into {b} (time ranges overlap)")
    return problems


def hyperopt_files(plan: FoldPlan) -> tuple[list[Unit], list[Unit]]:
    """(train, validation) quarters of a symbol's hyperparameter search: every quarter strictly before the plan's
    earliest test quarter (all quarters when no fold has one), the last of them validating.

    Tuning once on this range and using the result in every fold never lets a test quarter choose a parameter."""
    files = sorted(
        {r.name: r for f in plan.folds for r in (*f.train, *f.val, *f.test)}.values(), key=lambda r: (r.start, r.name)
    )
    tests = [r for f in plan.folds for r in f.test]
    if tests:
        first = min(r.start for r in tests)
        files = [r for r in files if r.end < first]
    if len(files) < 2:
        raise PlanError(
            f"hyperopt needs >= 2 calendar quarters before the first test quarter (one to train, one to validate), "
            f"found {len(files)}"
        )
    return files[:-1], files[-1:]


def hyperopt_leakage(plan: FoldPlan, results: dict) -> list[str]:
    """Problems with a hyperopt `results.json` (a dict) against a fold plan: a quarter it trained or validated on
    that is a test quarter of any fold, or a results file that does not say which quarters it used.

    Every fold is checked because one results file serves every fold's checkpoint; a nested search's results
    (`cv_fold=k`, fold k's own files) pass only for k = 0, and must only ever be used for their own fold."""
    used = {split: results.get(f"{split}_files") for split in ("train", "val")}
    missing = [f"{split}_files" for split, names in used.items() if not isinstance(names, list)]
    if missing:
        return [f"hyperopt results do not record {' and '.join(missing)}: the quarters they used cannot be checked"]
    return [
        f"fold {fold.fold}: test quarter {ref.name} was a hyperopt {split} quarter"
        for fold in plan.folds
        for ref in fold.test
        for split, names in used.items()
        if ref.name in names
    ]
