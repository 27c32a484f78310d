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
end (NaN past it), so no sample or label horizon crosses a split boundary. On top of that the plan purges and
embargoes in CME sessions (Lopez de Prado, AFML ch. 7, adapted to walk-forward, where training always precedes):

- `purge_sessions` P (default `PURGE_SESSIONS`, 0): the last P sessions of a fold's training span are dropped
  from its training (and its labels cut again at the new end), so no label horizon of a training row reaches the
  validation quarter and the session the validation starts in (where a quarter's split falls inside a session,
  as at Databento's 00:00 UTC split) is never trained on;
- `embargo_sessions` E (default `EMBARGO_SESSIONS`, 0): the first E sessions of the validation quarter (after
  training) and of the test quarter (after validation, which chose the checkpoint and its policy) are not scored,
  so the serial correlation across a boundary cannot flatter a score.

Sessions are counted on the calendar (`sessions_back`, `sessions_forward`): the CME trading days (weekdays but the
exchange's holidays) from the session of the segment's last (first) record back (on). The cut lives in
the plan: a fold's units are the rows each split reads (`Part` ranges, applied by `predecode.unit_sidecars`), the
dates cut are recorded (`Fold.purged`, `Fold.val_embargoed`, `Fold.test_embargoed`), and evaluation cuts a
quarter's first E sessions with the same function (`embargo`). A purge or embargo that leaves a split without
rows is a PlanError naming the setting and the quarter. `check_leakage` proves all of it, and `hyperopt_leakage`
proves that a hyperparameter search touched no test quarter (`hyperopt_files`, purged and embargoed alike).
"""

from __future__ import annotations

import datetime as dt
import warnings
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from alpha_core.bounds import MAX_GAP_SESSIONS, GapSessions
from alpha_core.data.front_month import cme_holidays
from alpha_core.errors import PlanError
from alpha_core.sessions import session_day, session_open_ns

N_FOLDS = 3  # walk-forward folds per symbol, each with a test quarter: the default of every door
# sessions dropped from training before its validation quarter, and not scored at the start of a validation and a
# test quarter: the default of every door (docs/data.md, "Purge and embargo", says why 0 and 0, and when to use 1 and 1)
PURGE_SESSIONS = 0
EMBARGO_SESSIONS = 0
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
    train: list[Unit]  # its rows: the last `purge_sessions` sessions before validation cut off
    val: list[Unit]  # its rows: the first `embargo_sessions` sessions cut off
    test: list[Unit]  # idem
    purged: list[str] = []  # session dates dropped from training (ISO, in time order)
    val_embargoed: list[str] = []  # session dates of the validation quarter not scored
    test_embargoed: list[str] = []  # session dates of the test quarter not scored


class FoldPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cv_n_folds: int
    cv_train_window: int  # as requested (0 = derived)
    window: int  # resolved number of training quarters per fold
    n_files: int
    n_units: int  # calendar quarters
    schema_name: str | None = None  # the schema planned (None: not said)
    purge_sessions: GapSessions = 0  # sessions purged from training before validation (0 in plans made before it)
    embargo_sessions: GapSessions = 0  # sessions not scored at the start of validation and test
    units: list[str]  # every quarter, in time order
    quarters: list[Unit] = []  # every quarter whole (what `hyperopt_files` splits again)
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


# --- purge and embargo -----------------------------------------------------------------------------------


def _trading_day(day: dt.date) -> bool:
    return day.weekday() < 5 and day not in cme_holidays(day.year)


def sessions_back(ts_ns: int, n: int) -> list[dt.date]:
    """The last `n` CME trading days (weekdays but the exchange's holidays) up to the session of `ts_ns`, latest
    first. A segment cut at a quarter's 00:00 UTC may end (or start) in a session without trading, such as New
    Year's Day's: it is not counted, and a cut at the session's open removes its records with the counted ones."""
    day = session_day(ts_ns)
    out = []
    while len(out) < n:
        if _trading_day(day):
            out.append(day)
        day -= dt.timedelta(days=1)
    return out


def sessions_forward(ts_ns: int, n: int) -> list[dt.date]:
    """The first `n` CME trading days from the session of `ts_ns` on, earliest first (`sessions_back`)."""
    day = session_day(ts_ns)
    out = []
    while len(out) < n:
        if _trading_day(day):
            out.append(day)
        day += dt.timedelta(days=1)
    return out


def _clip(unit: Unit, lo: int, hi: int) -> Unit | None:
    """The unit's records in [lo, hi] (None when none are left); a part cut short reads its sidecar's rows
    (`whole` False), whose labels are cut again at the new end (`sidecar.rows_between`)."""
    parts = []
    for p in unit.parts:
        start, end = max(p.start, lo), min(p.end, hi)
        if start <= end:
            parts.append(
                Part(path=p.path, name=p.name, start=start, end=end, whole=p.whole and (start, end) == (p.start, p.end))
            )
    if not parts:
        return None
    return Unit(name=unit.name, start=min(p.start for p in parts), end=max(p.end for p in parts), parts=parts)


def purge(units: list[Unit], sessions: int, where: str = "") -> tuple[list[Unit], list[str]]:
    """A training span without its last `sessions` sessions, and the dates dropped. A PlanError names the setting
    and the quarters when nothing is left."""
    if sessions == 0 or not units:
        return units, []
    dropped = sessions_back(units[-1].end, sessions)
    cut = session_open_ns(dropped[-1]) - 1  # the last ns before the earliest dropped session opens
    kept = [u for u in (_clip(u, u.start, cut) for u in units) if u is not None]
    if not kept:
        names = ", ".join(u.name for u in units)
        raise PlanError(
            f"{where}purge_sessions {sessions} leaves no training rows in {names} (its sessions from {dropped[-1]} to "
            f"{dropped[0]} are purged and nothing earlier is left): lower --purge-sessions"
        )
    return kept, [str(d) for d in reversed(dropped)]


def embargo(unit: Unit, sessions: int, where: str = "", split: str = "test") -> tuple[Unit, list[str]]:
    """A validation or test quarter without its first `sessions` sessions, and the dates not scored. A PlanError
    names the setting and the quarter when nothing is left."""
    if sessions == 0:
        return unit, []
    dropped = sessions_forward(unit.start, sessions)
    kept = _clip(unit, session_open_ns(dropped[-1] + dt.timedelta(days=1)), unit.end)
    if kept is None:
        raise PlanError(
            f"{where}embargo_sessions {sessions} leaves no {split} rows in {unit.name} (its sessions from {dropped[0]} "
            f"to {dropped[-1]} are embargoed and nothing later is left): lower --embargo-sessions"
        )
    return kept, [str(d) for d in dropped]


def _fold(k: int, train: list[Unit], val: list[Unit], test: list[Unit], p: int, e: int, what: str) -> Fold:
    """Fold k with its purge and embargo applied (`purge`, `embargo`): each split holds one quarter at most but
    training."""
    where = f"{what}fold {k}: "
    train, purged = purge(train, p, where)
    cut = {}
    for split, units in (("validation", val), ("test", test)):
        cut[split] = embargo(units[0], e, where, split) if units else None
    return Fold(
        fold=k,
        train=train,
        val=[cut["validation"][0]] if val else [],
        test=[cut["test"][0]] if test else [],
        purged=purged,
        val_embargoed=cut["validation"][1] if val else [],
        test_embargoed=cut["test"][1] if test else [],
    )


def _quarters(n: int) -> str:
    return f"{n} quarter{'s' if n != 1 else ''}"


def plan_folds(
    files: list[FileRef],
    cv_n_folds: int = N_FOLDS,
    cv_train_window: int = 0,
    allow_untested_folds: bool = False,
    schema: str | None = None,
    purge_sessions: int = PURGE_SESSIONS,
    embargo_sessions: int = EMBARGO_SESSIONS,
) -> FoldPlan:
    """Plan every fold over the files' calendar quarters, purged and embargoed; a layout that does not fit is a
    PlanError naming the schema and the numbers."""
    if cv_n_folds < 1:
        raise PlanError(f"--cv-n-folds must be >= 1 (got {cv_n_folds})")
    if cv_train_window < 0:
        raise PlanError(f"--cv-train-window must be >= 0 (got {cv_train_window})")
    for flag, value in (("--purge-sessions", purge_sessions), ("--embargo-sessions", embargo_sessions)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GAP_SESSIONS:
            raise PlanError(f"{flag} must be an integer in [0, {MAX_GAP_SESSIONS}] (got {value!r})")
    units = calendar_units(files)
    n = len(units)
    what = f"{schema}: " if schema else ""
    found = f"{_quarters(n)} ({', '.join(u.name for u in units) or 'no files'})"
    common = dict(
        cv_train_window=cv_train_window,
        n_files=len({f.path for f in files}),
        n_units=n,
        schema_name=schema,
        purge_sessions=purge_sessions,
        embargo_sessions=embargo_sessions,
        units=[u.name for u in units],
        quarters=units,
        gaps=calendar_gaps(units, schema),
    )
    if cv_n_folds == 1:
        if n < 2:
            raise PlanError(
                f"{what}need >= 2 calendar quarters for a single-fold temporal split, found {found}: a fold trains on "
                f"whole quarters"
            )
        folds = [_fold(0, units[:-1], [units[-1]], [], purge_sessions, embargo_sessions, what)]
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
        folds.append(_fold(k, units[k:val_idx], [units[val_idx]], test, purge_sessions, embargo_sessions, what))
    return FoldPlan(cv_n_folds=cv_n_folds, window=window, folds=folds, **common)


def _gap_problems(plan: FoldPlan, fold: Fold) -> list[str]:
    """The purge and the embargo of one fold, proved from its rows' time ranges: no training row within
    `purge_sessions` sessions of the validation start, no validation or test row in the first `embargo_sessions`
    sessions of its quarter."""
    problems = []
    p, e = plan.purge_sessions, plan.embargo_sessions
    if fold.train and fold.val and p:
        train_end, val_start = max(u.end for u in fold.train), min(u.start for u in fold.val)
        if len(fold.purged) != p:
            problems.append(f"fold {fold.fold}: {len(fold.purged)} session(s) purged from training, purge_sessions is {p}")
        elif train_end >= session_open_ns(dt.date.fromisoformat(fold.purged[0])):
            problems.append(f"fold {fold.fold}: training reaches its purged session {fold.purged[0]}")
        # the validation quarter's first session, scored or not
        first = dt.date.fromisoformat(fold.val_embargoed[0]) if fold.val_embargoed else session_day(val_start)
        last = session_day(train_end)
        between = sum(_trading_day(last + dt.timedelta(days=i)) for i in range(1, (first - last).days + 1))
        if last >= first or between < p:
            problems.append(
                f"fold {fold.fold}: training ends in session {last}, within {p} session(s) of the validation start ({first})"
            )
    for split, units, cut in (("val", fold.val, fold.val_embargoed), ("test", fold.test, fold.test_embargoed)):
        if not units or not e:
            continue
        if len(cut) != e:
            problems.append(f"fold {fold.fold}: {len(cut)} {split} session(s) embargoed, embargo_sessions is {e}")
            continue
        first = session_day(min(u.start for u in units))
        if first <= dt.date.fromisoformat(cut[-1]):
            problems.append(f"fold {fold.fold}: {split} scores session {first}, inside its embargo (to {cut[-1]})")
    return problems


def check_leakage(plan: FoldPlan) -> list[str]:
    """Problems with a plan: a quarter (or a file's part) in two splits, splits whose time ranges are not
    strictly ordered, or a purge or embargo that does not hold (`_gap_problems`)."""
    problems = []
    for fold in plan.folds:
        problems += _gap_problems(plan, fold)
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

    Tuning once on this range and using the result in every fold never lets a test quarter choose a parameter. The
    split is purged and embargoed as a fold is (the plan's `purge_sessions`, `embargo_sessions`)."""
    files = plan.quarters or sorted(  # plans made before `quarters` was recorded: their folds' quarters
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
    train, _ = purge(files[:-1], plan.purge_sessions, "hyperopt: ")
    val, _ = embargo(files[-1], plan.embargo_sessions, "hyperopt: ", "validation")
    return train, [val]


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
