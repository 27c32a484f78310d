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
    hyperopt_files,
    hyperopt_leakage,
    plan_folds,
)
from alpha_core.errors import PlanError

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
