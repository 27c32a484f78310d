"""Purge and embargo in sessions (issue 31 item 4): the plan cuts exactly the sessions it names, on generated data and
on Databento's splits, every reader of a fold's rows honours the cut, a cut that empties a split is a PlanError, and
`check_leakage` catches a plan that breaks it."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from pydantic import ValidationError
from test_folds import _layout

from alpha_core.data.folds import (
    EMBARGO_SESSIONS,
    PURGE_SESSIONS,
    FoldPlan,
    check_leakage,
    hyperopt_files,
    plan_folds,
)
from alpha_core.data.predecode import fold_data, predecode, quarter_sidecars
from alpha_core.errors import PlanError
from alpha_core.sessions import session_days, session_open_ns

EPOCH = dt.date(1970, 1, 1)


def sessions(sidecars) -> list[dt.date]:
    """The distinct CME session dates of the sidecars' rows, in order."""
    days = np.unique(np.concatenate([session_days(np.asarray(sc.ts)) for sc in sidecars]))
    return [EPOCH + dt.timedelta(days=int(d)) for d in days]


@pytest.fixture(scope="module")
def bars(tiny_data, tmp_path_factory):
    """The ES.FUT bar sidecars of `alpha demo-data --scale tiny` (5 quarters of 3 sessions)."""
    out = tmp_path_factory.mktemp("purge-pd")
    return [p.sidecar for p in predecode(tiny_data / "ES.FUT", out, "ES.FUT", "ohlcv-1m")]


def plan(bars, purge: int, embargo: int) -> FoldPlan:
    from alpha_core.data.predecode import file_ref

    return plan_folds([file_ref(sc) for sc in bars], purge_sessions=purge, embargo_sessions=embargo, schema="ohlcv-1m")


@pytest.mark.parametrize("purge, embargo", [(1, 1), (2, 0), (0, 2), (0, 0)])
def test_the_plan_drops_exactly_the_last_and_first_sessions_of_the_demo_data(bars, purge, embargo):
    whole = fold_data(plan(bars, 0, 0), bars)
    cut_plan = plan(bars, purge, embargo)
    assert check_leakage(cut_plan) == []
    test_quarters = quarter_sidecars(bars, embargo)
    whole_quarters = quarter_sidecars(bars)
    for before, after, fold in zip(whole, fold_data(cut_plan, bars), cut_plan.folds, strict=True):
        train, val = sessions(before.train), sessions(before.val)
        assert len(train) == len(val) == 3  # the tiny scale's sessions per quarter
        assert sessions(after.train) == train[: len(train) - purge]
        assert fold.purged == [str(d) for d in train[len(train) - purge :]]
        assert sessions(after.val) == val[embargo:] and fold.val_embargoed == [str(d) for d in val[:embargo]]
        # what evaluation scores a test quarter on: the plan's test rows, from the same function
        (test_name,) = before.test_names
        test = sessions([whole_quarters[test_name]])
        assert sessions([test_quarters[test_name]]) == test[embargo:]
        assert fold.test_embargoed == [str(d) for d in test[:embargo]]
        # the purge is the label horizon's too: no training label reads past the training's last row
        for sc in after.train:
            ts, labels = np.asarray(sc.ts), np.asarray(sc.labels)
            for j, h in enumerate(sc.meta.horizons):
                labelled = ts[np.isfinite(labels[:, j])]
                assert labelled.size and labelled.max() + h * 60 * 10**9 <= ts.max()


def test_hyperopts_split_is_purged_and_embargoed_too(bars):
    train, val = hyperopt_files(plan(bars, 1, 1))
    whole_train, whole_val = hyperopt_files(plan(bars, 0, 0))
    by_path = {sc.meta.source.path: sc for sc in bars}
    from alpha_core.data.predecode import unit_sidecars

    def rows(units):
        return sessions([sc for u in units for sc in unit_sidecars(u, by_path)])

    assert rows(train) == rows(whole_train)[:-1] and rows(val) == rows(whole_val)[1:]


@pytest.mark.parametrize(
    "purge, embargo, message",
    [
        (3, 0, r"ohlcv-1m: fold 0: purge_sessions 3 leaves no training rows in 2024-Q1 .*lower --purge-sessions"),
        (0, 3, r"ohlcv-1m: fold 0: embargo_sessions 3 leaves no validation rows in 2024-Q2 .*lower --embargo-sessions"),
    ],
)
def test_a_cut_that_empties_a_split_names_the_setting_and_the_quarter(bars, purge, embargo, message):
    with pytest.raises(PlanError, match=message):
        plan(bars, purge, embargo)


@pytest.mark.parametrize("value", [-1, 1.5, "1", True, 67])
def test_out_of_range_values_are_refused(value):
    with pytest.raises(PlanError, match=r"--purge-sessions must be an integer in \[0, 66\]"):
        plan_folds(_layout("quarterly"), purge_sessions=value)
    with pytest.raises(PlanError, match=r"--embargo-sessions must be an integer in \[0, 66\]"):
        plan_folds(_layout("quarterly"), embargo_sessions=value)


@pytest.mark.parametrize("value", [-1, 1.5, 67, "two"])
def test_every_config_refuses_an_out_of_range_purge_or_embargo(value, tmp_path):
    from alpha_assets.defs.data import FoldConfig
    from alpha_core.eval.configs import EvalConfig
    from alpha_core.hyperopt.configs import HyperoptConfig
    from alpha_core.train.configs import RLTrainConfig, SupervisedTrainConfig, TrainConfig

    base = {
        TrainConfig: dict(mbp10_data_dir=tmp_path, predecoded_dir=tmp_path, out=tmp_path),
        SupervisedTrainConfig: dict(model="kan", data_dir=tmp_path, output_dir=tmp_path),
        RLTrainConfig: dict(model="ppo", data_dir=tmp_path, output_dir=tmp_path),
        HyperoptConfig: dict(model="kan", data_dir=tmp_path, output=tmp_path / "r.json"),
        FoldConfig: {},
    }
    plan_dump = plan_folds(_layout("quarterly")).model_dump()
    for key in ("purge_sessions", "embargo_sessions"):
        for cls, given in base.items():
            with pytest.raises((ValidationError, Exception), match=key):
                cls(**given, **{key: value})
        with pytest.raises(ValidationError, match=key):
            FoldPlan.model_validate({**plan_dump, key: value})
    with pytest.raises(ValidationError, match="embargo_sessions"):
        EvalConfig(models_dir=tmp_path, data_dir=tmp_path, output=tmp_path / "r.json", embargo_sessions=value)


def test_a_session_split_at_midnight_utc_is_never_in_training_and_validation():
    """Databento splits a download at 00:00 UTC: a quarter's first session opened the evening before (Chicago) and its
    first hours lie in the quarter before. Purge 1 keeps that whole session out of training, embargo 1 out of the
    validation score, whatever the split of the files."""
    plans = {
        split: plan_folds(_layout(split), cv_n_folds=3, purge_sessions=1, embargo_sessions=1)
        for split in ("daily", "monthly", "quarterly", "single")
    }
    fold = plans["daily"].folds[0]
    assert [u.name for u in fold.train] == ["2024-Q1"] and [u.name for u in fold.val] == ["2024-Q2"]
    # 2024-Q2's first session is Monday April 1st, open from Sunday 17:00 CT (22:00 UTC, March 31: in 2024-Q1)
    assert fold.purged == ["2024-04-01"] and fold.val_embargoed == ["2024-04-01"]
    assert max(u.end for u in fold.train) < session_open_ns(dt.date(2024, 4, 1))
    assert min(u.start for u in fold.val) >= session_open_ns(dt.date(2024, 4, 2))
    # the test quarter 2024-Q3 opens on Monday July 1st
    assert fold.test_embargoed == ["2024-07-01"] and min(u.start for u in fold.test) >= session_open_ns(dt.date(2024, 7, 2))
    for p in plans.values():
        assert check_leakage(p) == []
        assert [(f.purged, f.val_embargoed, f.test_embargoed) for f in p.folds] == [
            (f.purged, f.val_embargoed, f.test_embargoed) for f in plans["daily"].folds
        ]


def test_the_leakage_check_proves_the_purge_and_the_embargo():
    plan_ = plan_folds(_layout("daily"), cv_n_folds=3, purge_sessions=2, embargo_sessions=2)
    assert check_leakage(plan_) == []
    whole = plan_folds(_layout("daily"), cv_n_folds=3, purge_sessions=0, embargo_sessions=0)
    fold, uncut = plan_.folds[0], whole.folds[0]

    def broken(**update) -> list[str]:
        return check_leakage(plan_.model_copy(update={"folds": [fold.model_copy(update=update)]}))

    assert broken(train=uncut.train) == [
        "fold 0: training reaches its purged session 2024-03-28",
        "fold 0: training ends in session 2024-04-01, within 2 session(s) of the validation start (2024-04-01)",
    ]
    assert broken(val=uncut.val) == ["fold 0: val scores session 2024-04-01, inside its embargo (to 2024-04-02)"]
    assert broken(test=uncut.test) == ["fold 0: test scores session 2024-07-01, inside its embargo (to 2024-07-02)"]
    assert broken(purged=fold.purged[1:]) == ["fold 0: 1 session(s) purged from training, purge_sessions is 2"]
    assert broken(test_embargoed=[]) == ["fold 0: 0 test session(s) embargoed, embargo_sessions is 2"]


def test_every_door_defaults_to_the_plans_purge_and_embargo():
    """`alpha folds`, the three CLI trainers, `alpha hyperopt`, `alpha evaluate`, Dagster's fold plans (which the
    checkpoints, the searches and the report read, and `alpha run` leaves at its default): one default each."""
    from alpha_assets.defs.data import FoldConfig
    from alpha_core.cli import build_parser
    from alpha_core.eval.configs import EvalConfig
    from alpha_core.hyperopt.configs import HyperoptConfig
    from alpha_core.train.configs import RLTrainConfig, SupervisedTrainConfig, TrainConfig

    assert plan_folds(_layout("quarterly")).model_dump()["purge_sessions"] == PURGE_SESSIONS
    for cls in (TrainConfig, SupervisedTrainConfig, RLTrainConfig, HyperoptConfig, FoldConfig):
        fields = getattr(cls, "model_fields", None) or cls.__fields__
        assert (fields["purge_sessions"].default, fields["embargo_sessions"].default) == (PURGE_SESSIONS, EMBARGO_SESSIONS), cls
    assert EvalConfig.model_fields["embargo_sessions"].default == EMBARGO_SESSIONS
    for command in ("folds", "train", "train-supervised", "train-rl", "hyperopt", "evaluate"):
        help_text = build_parser(command).chosen.format_help()
        assert "--embargo-sessions" in help_text and (command == "evaluate" or "--purge-sessions" in help_text), command
    folds = build_parser("folds").parse_args(["folds", "--data-dir", "d"])
    assert (folds.purge_sessions, folds.embargo_sessions) == (PURGE_SESSIONS, EMBARGO_SESSIONS)
