"""Walk-forward fold plans: the original system's split rules, every error, and the leakage check."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from alpha_core.data.folds import (
    N_FOLDS,
    FileRef,
    Fold,
    FoldPlan,
    UntestedFoldWarning,
    calendar_units,
    check_leakage,
    check_schemas_agree,
    hyperopt_files,
    hyperopt_leakage,
    plan_folds,
)
from alpha_core.errors import PlanError
from alpha_core.sessions import session_day

NS_DAY = 86_400 * 10**9


def q(i: int) -> str:
    """The name of the i-th quarter from 2024-Q1."""
    return f"{2024 + i // 4}-Q{i % 4 + 1}"


def ns(day: dt.date, hour: int = 12) -> int:
    return int(dt.datetime(day.year, day.month, day.day, hour, tzinfo=dt.UTC).timestamp()) * 10**9


def refs(n: int) -> list[FileRef]:
    """One file per calendar quarter from 2024-Q1, each from the 5th of its first month to the 20th of its last."""
    out = []
    for i in range(n):
        year, first = 2024 + i // 4, 3 * (i % 4) + 1
        start, end = ns(dt.date(year, first, 5)), ns(dt.date(year, first + 2, 20))
        out.append(FileRef(path=f"/d/f{i}.dbn.zst", name=f"f{i}.dbn.zst", start=start, end=end))
    return out


def names(files):
    return [f.name for f in files]


def test_the_default_plan_is_the_pipelines_walk_forward_with_a_test_file_in_every_fold():
    plan = plan_folds(refs(6))
    assert plan.cv_n_folds == N_FOLDS == 3 and plan.window == 2
    assert all(len(f.test) == 1 for f in plan.folds)
    with pytest.raises(PlanError, match=r"4 quarters \(2024-Q1, .*\) are too few for 3 walk-forward folds .* --cv-n-folds 1"):
        plan_folds(refs(4))


def test_single_fold_is_an_explicit_opt_in_that_trains_on_all_but_last_and_validates_on_last():
    with pytest.warns(UntestedFoldWarning, match="no test quarter"):
        plan = plan_folds(refs(4), cv_n_folds=1)
    (fold,) = plan.folds
    assert names(fold.train) == [q(0), q(1), q(2)] and names(fold.val) == [q(3)] and fold.test == []
    assert plan.window == 3


def test_sliding_window_with_test_file_after_validation():
    plan = plan_folds(refs(6), cv_n_folds=3, cv_train_window=2)
    assert [(names(f.train), names(f.val), names(f.test)) for f in plan.folds] == [
        ([q(0), q(1)], [q(2)], [q(3)]),
        ([q(1), q(2)], [q(3)], [q(4)]),
        ([q(2), q(3)], [q(4)], [q(5)]),
    ]
    assert check_leakage(plan) == []


@pytest.mark.parametrize("n, folds", [(6, 3), (5, 2), (4, 2), (8, 3), (10, 4)])
def test_default_window_tests_every_fold(n, folds, recwarn):
    plan = plan_folds(refs(n), cv_n_folds=folds)
    assert plan.window == n - folds - 1
    assert all(len(f.test) == 1 for f in plan.folds)
    assert names(plan.folds[-1].test) == [q(n - 1)]
    assert not [w for w in recwarn if issubclass(w.category, UntestedFoldWarning)]


def test_a_fold_without_a_test_file_is_an_explicit_opt_in():
    with pytest.raises(
        PlanError,
        match=r"fold\(s\) 1 would have no test quarter: 2 folds x window 3 need 6 quarters, "
        r"5 available .*--allow-untested-folds",
    ):
        plan_folds(refs(5), cv_n_folds=2, cv_train_window=3)
    with pytest.warns(UntestedFoldWarning, match=r"fold\(s\) 1 have no test quarter"):
        plan = plan_folds(refs(5), cv_n_folds=2, cv_train_window=3, allow_untested_folds=True)
    assert names(plan.folds[0].test) == [q(4)] and plan.folds[1].test == []


def test_files_are_ordered_by_time_not_by_input_order():
    plan = plan_folds(list(reversed(refs(6))))
    assert names(plan.folds[0].train) == [q(0), q(1)] and names(plan.folds[2].test) == [q(5)]


@pytest.mark.parametrize(
    "n, folds, window, message",
    [
        (5, 0, 0, r"--cv-n-folds must be >= 1 \(got 0\)"),
        (5, 2, -1, r"--cv-train-window must be >= 0 \(got -1\)"),
        (1, 1, 0, r"need >= 2 calendar quarters for a single-fold temporal split, found 1 quarter \(2024-Q1\)"),
        (2, 2, 0, r"2 quarters \(2024-Q1, 2024-Q2\) are too few for 2 walk-forward folds .* at least 4 calendar quarters"),
        (3, 2, 0, r"3 quarters .* are too few for 2 walk-forward folds .* at least 4 calendar quarters"),
        (4, 3, 2, r"CV layout overflows: cv_fold=2 \+ window=2 \+ 1 val quarter > 4 quarters available"),
    ],
)
def test_invalid_layouts_say_which_numbers_do_not_fit(n, folds, window, message):
    with pytest.raises(PlanError, match=message):
        plan_folds(refs(n), folds, window)


def test_fold_index_must_be_below_fold_count():
    with pytest.raises(PlanError, match=r"--cv-fold 3 must be < --cv-n-folds 3"):
        plan_folds(refs(6), 3, 2).fold(3)


def test_leakage_check_catches_shared_quarters_and_overlapping_time():
    f = calendar_units(refs(3))
    common = dict(cv_n_folds=1, cv_train_window=0, n_files=3, n_units=3, units=[u.name for u in f], gaps=[])
    shared = FoldPlan(window=2, folds=[Fold(fold=0, train=[f[0], f[1]], val=[f[1]], test=[])], **common)
    assert any(f"{q(1)} is in both train and val" in p for p in check_leakage(shared))
    late = f[0].model_copy(update={"end": f[1].start + 1})
    overlap = FoldPlan(window=1, folds=[Fold(fold=0, train=[late], val=[f[1]], test=[])], **common)
    assert check_leakage(overlap) == ["fold 0: train data reaches into val (time ranges overlap)"]


@pytest.mark.parametrize("n, folds, window", [(6, 1, 0), (6, 2, 0), (6, 3, 0), (7, 2, 2), (9, 3, 1), (5, 3, 0)])
def test_hyperopt_files_precede_every_test_file(n, folds, window, recwarn):
    plan = plan_folds(refs(n), folds, window)
    train, val = hyperopt_files(plan)
    used = {r.name for r in (*train, *val)}
    tests = [r for f in plan.folds for r in f.test]
    assert used and not used & {r.name for r in tests}
    assert all(r.end < t.start for r in (*train, *val) for t in tests)
    assert val == [max((*train, *val), key=lambda r: r.start)]  # the last of them validates
    results = {"train_files": [r.name for r in train], "val_files": [r.name for r in val]}
    assert hyperopt_leakage(plan, results) == []
    if tests:  # the old default (train on all but the last file, validate on the last) is caught
        old = plan_folds(refs(n), 1, 0)
        leaked = {"train_files": names(old.folds[0].train), "val_files": names(old.folds[0].val)}
        problems = hyperopt_leakage(plan, leaked)
        assert len(problems) == len(tests)
        assert all(f"test quarter {t.name} was a hyperopt" in p for t, p in zip(tests, problems, strict=True))


def test_hyperopt_leakage_needs_the_files_recorded():
    plan = plan_folds(refs(6), 3)
    assert hyperopt_leakage(plan, {"trials": []}) == [
        "hyperopt results do not record train_files and val_files: the quarters they used cannot be checked"
    ]


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_folds_plan_from_the_sidecars_without_decoding(tiny_data, tmp_path, capsys):
    """`alpha folds --predecoded-dir` takes each file's record range from its sidecar's meta when the sidecar was
    built from the file as it is now: the same plan as reading the timestamps, without reading the files."""
    from alpha_core.cli import main

    def folds(*extra) -> tuple[dict, int]:
        before = _bytes_read()
        assert main(["folds", "--data-dir", str(tiny_data / "ES.FUT"), "--cv-n-folds", "2", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out), _bytes_read() - before

    cache = tmp_path / "pd"
    assert main(["predecode", "--data-dir", str(tiny_data), "--output-dir", str(cache), "--symbols", "ES.FUT"]) == 0
    capsys.readouterr()
    decoded, read_decoding = folds()
    planned, read_planning = folds("--predecoded-dir", str(cache))
    assert planned == decoded
    source_bytes = sum(p.stat().st_size for p in (tiny_data / "ES.FUT").rglob("*.dbn.zst"))
    assert read_decoding > source_bytes and read_planning < source_bytes / 4, (read_decoding, read_planning)


def _bytes_read() -> int:
    return int(next(line.split()[1] for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar:")))


# --- calendar quarters, whatever the split (issue 32 item 2) ----------------------------------------------------


def _weekdays(first: dt.date, last: dt.date) -> list[dt.date]:
    return [
        first + dt.timedelta(days=i) for i in range((last - first).days + 1) if (first + dt.timedelta(days=i)).weekday() < 5
    ]


def _layout(split: str) -> list[FileRef]:
    """Files of the sessions 2024-01-02 .. 2025-03-31 (17:00 CT the evening before to 16:00 CT), as a download of that
    range splits them by UTC date: daily, weekly, monthly, quarterly, or one file."""
    from alpha_core.data.front_month import cme_holidays
    from alpha_core.sessions import session_open_ns

    hour = 3_600 * 10**9
    days = [d for d in _weekdays(dt.date(2024, 1, 2), dt.date(2025, 3, 31)) if d not in cme_holidays(d.year)]
    sessions = [(session_open_ns(d), session_open_ns(d) + 23 * hour - 1) for d in days]  # 17:00 .. 16:00 CT

    def key(ts: int):
        day = dt.datetime.fromtimestamp(ts / 1e9, dt.UTC).date()
        return {
            "daily": day,
            "weekly": day - dt.timedelta(days=day.weekday()),
            "monthly": (day.year, day.month),
            "quarterly": (day.year, (day.month - 1) // 3),
            "single": 0,
        }[split]

    groups: dict = {}
    for start, end in sessions:  # a session's records split at UTC midnight, as Databento's daily files are
        midnight = (end // (24 * hour)) * 24 * hour
        for lo, hi in ((start, midnight - 1), (midnight, end)) if start < midnight <= end else ((start, end),):
            span = groups.setdefault(key(lo), [lo, hi])
            span[0], span[1] = min(span[0], lo), max(span[1], hi)
    return [
        FileRef(path=f"/d/{split}-{i}.dbn.zst", name=f"{split}-{i}", start=a, end=b) for i, (a, b) in enumerate(groups.values())
    ]


@pytest.mark.parametrize("split", ["daily", "weekly", "monthly", "single"])
def test_every_split_of_a_download_plans_the_same_calendar_quarters(split):
    """Databento splits a download by day (the default), week or month, or not at all: the plan counts calendar
    quarters, so every split plans the folds of the quarterly files, and none reports a gap."""
    quarterly = plan_folds(_layout("quarterly"))
    plan = plan_folds(_layout(split))
    assert plan.units == quarterly.units == [q(i) for i in range(5)] and plan.gaps == quarterly.gaps == []
    assert plan.n_files == len(_layout(split)) and quarterly.n_units == plan.n_units == 5
    folds = [[names(f.train), names(f.val), names(f.test)] for f in plan.folds]
    assert folds == [[names(f.train), names(f.val), names(f.test)] for f in quarterly.folds]
    assert folds[0] == [[q(0)], [q(1)], [q(2)]] and check_leakage(plan) == []


def test_a_file_over_several_quarters_gives_each_quarter_its_part():
    (single,) = _layout("single")
    units = calendar_units([single])
    assert [u.name for u in units] == [q(i) for i in range(5)]
    assert all(len(u.parts) == 1 and not u.parts[0].whole and u.parts[0].path == single.path for u in units)
    for a, b in zip(units, units[1:], strict=False):
        assert a.parts[0].end < b.parts[0].start  # the parts tile the file without overlap
    assert units[0].parts[0].start == single.start and units[-1].parts[0].end == single.end
    whole = calendar_units(refs(5))  # a file inside one quarter is used whole
    assert all(len(u.parts) == 1 and u.parts[0].whole for u in whole)


def test_a_record_belongs_to_the_quarter_of_its_utc_date():
    """Databento splits a download by UTC date and `alpha fetch` writes quarters of UTC dates ([2024-01-01,
    2024-04-01)): the evening of Sunday 2024-03-31 (the opening of Monday's session) is 2024-Q1, so those files are
    whole quarters; a file over the midnight of April 1 gives 2024-Q2 its records from then on."""
    sunday = FileRef(path="/d/a", name="a", start=ns(dt.date(2024, 3, 31), 22), end=ns(dt.date(2024, 3, 31), 23))
    assert [u.name for u in calendar_units([sunday])] == ["2024-Q1"]
    across = FileRef(path="/d/b", name="b", start=ns(dt.date(2024, 3, 31), 22), end=ns(dt.date(2024, 4, 1), 10))
    units = calendar_units([across])
    assert [u.name for u in units] == ["2024-Q1", "2024-Q2"] and units[1].parts[0].start == ns(dt.date(2024, 4, 1), 0)
    assert all(len(u.parts) == 1 and u.parts[0].whole for u in calendar_units(_layout("quarterly")))


def test_a_missing_quarter_and_a_missing_day_are_reported():
    files = _layout("daily")
    lost_day = dt.date(2024, 5, 15)  # a Wednesday: its file is gone
    kept = [
        f
        for f in files
        if dt.datetime.fromtimestamp(f.start / 1e9, dt.UTC).date() != lost_day
        and not dt.date(2024, 7, 1) <= session_day(f.start) < dt.date(2024, 10, 1)  # and 2024-Q3's sessions
    ]
    plan = plan_folds(kept, cv_n_folds=2, schema="mbp-10")
    assert plan.units == [q(0), q(1), q(3), q(4)]
    assert plan.gaps == [
        "2024-Q3: no mbp-10 files (a missing quarter: the folds step over it)",
        "2024-Q2: no mbp-10 records in 1 weekday session(s) inside the quarter (2024-05-15)",
    ]


def test_schemas_that_disagree_on_a_quarter_are_refused_naming_the_schema_and_the_quarter():
    check_schemas_agree({"mbp-10": refs(6), "ohlcv-1m": _layout("daily") + refs(6)[5:]})  # any split
    with pytest.raises(PlanError, match=r"^ohlcv-1m has no files for 2024-Q3 \(mbp-10 has\)"):
        check_schemas_agree({"mbp-10": refs(6), "ohlcv-1m": refs(2) + refs(6)[3:]})


def test_too_few_quarters_names_the_schema_and_the_quarters_three_folds_need():
    with pytest.raises(PlanError) as err:
        plan_folds(refs(1), schema="ohlcv-1m")
    assert str(err.value).startswith(
        "ohlcv-1m: 1 quarter (2024-Q1) is too few for 3 walk-forward folds (each needs a training, a validation and "
        "a test quarter: at least 5 calendar quarters)"
    )
