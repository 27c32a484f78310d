"""Hyperopt never touches a test file, and its params are checked where they are used; the DSR counts every trial
from every door; RL validation is the evaluator's Sharpe; early stopping is one rule."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import SMALL_BARS, flags

from alpha_core import metrics
from alpha_core.cli import main
from alpha_core.data.folds import hyperopt_leakage, plan_folds
from alpha_core.data.predecode import file_ref, predecode, quarter_sidecars
from alpha_core.eval.configs import DEFAULT_BAND, DEFAULT_HORIZON
from alpha_core.eval.evaluate import EvalConfig, evaluate, find_checkpoints
from alpha_core.eval.predict import load, predict
from alpha_core.eval.report import load_report
from alpha_core.eval.validation import file_score, recorded_sharpe
from alpha_core.gates import GateThresholds
from alpha_core.train.tracking import Trackers

SMALL = flags(**SMALL_BARS)


@pytest.fixture(scope="module")
def bars(tiny_data, tmp_path_factory):
    pd = tmp_path_factory.mktemp("pd")
    return (
        tiny_data / "ES.FUT" / "ohlcv-1m",
        pd,
        [p.sidecar for p in predecode(tiny_data / "ES.FUT" / "ohlcv-1m", pd, "ES.FUT", "ohlcv-1m")],
    )


def _hyperopt(model: str, bars_dir, pd, out, *extra: str) -> dict:
    rl = flags(timesteps_per_epoch=256, epochs=1, device="cpu")
    argv = [
        "hyperopt",
        *flags(model=model, trials=2, data_dir=bars_dir, output=out, predecoded_dir=pd),
        *(rl if model in ("dqn", "ppo") else SMALL),
        *extra,
    ]
    assert main(argv) == 0
    return json.loads(out.read_text())


@pytest.mark.filterwarnings("ignore::alpha_core.data.folds.UntestedFoldWarning")
@pytest.mark.parametrize("model", ["mamba2", "dqn"])
@pytest.mark.parametrize("folds", [1, 2, 3])
def test_hyperopt_never_touches_a_test_file(bars, tmp_path, model, folds):
    bars_dir, pd, sidecars = bars
    results = _hyperopt(model, bars_dir, pd, tmp_path / "results.json", "--cv-n-folds", str(folds))
    plan = plan_folds([file_ref(sc) for sc in sidecars], folds)
    tests = {r.name for f in plan.folds for r in f.test}
    used = set(results["train_files"]) | set(results["val_files"])
    assert not used & tests and hyperopt_leakage(plan, results) == []
    names = plan.units  # calendar quarters, in time order
    first_test = min((names.index(t) for t in tests), default=len(names))
    assert results["train_files"] + results["val_files"] == names[:first_test]  # every earlier quarter, the last validates
    assert len(results["val_files"]) == 1 and results["plan_test_files"] == sorted(tests, key=names.index)
    assert all(math.isfinite(t["val_sharpe"]) for t in results["trials"])
    if model == "dqn":  # the RL objective is the validation Sharpe itself
        assert [t["score"] for t in results["trials"]] == [t["val_sharpe"] for t in results["trials"]]


def test_the_original_commands_find_their_search_and_count_every_trial(bars, tiny_data, tmp_path, capsys):
    """The original system's three commands with only their flags: hyperopt into the original layout, train-supervised with its
    --params-file, evaluate with no --hyperopt-results. Every fold has an out-of-sample row, and the DSR counts
    N = trials x configurations with V = the null variance + the trials' dispersion (net of noise): the search is
    found through the checkpoint's own record, the same record Dagster's report reads."""
    bars_dir, pd, sidecars = bars
    run = tmp_path / "run"
    results_path = run / "hyperopt" / "mamba2" / "ES.FUT" / "results.json"
    results = _hyperopt("mamba2", bars_dir, pd, results_path, "--trials", "3")
    assert all(t["val_sessions"] >= 1 for t in results["trials"])
    models = run / "models"
    assert (
        main(
            [
                "train-supervised",
                *flags(
                    model="mamba2",
                    data_dir=bars_dir,
                    output_dir=models / "mamba2" / "ES.FUT",
                    params_file=results_path,
                    predecoded_dir=pd,
                ),
                *SMALL,
            ]
        )
        == 0
    )
    out = run / "eval" / "ensemble_report.json"
    assert (
        main(
            [
                "evaluate",
                *flags(models_dir=models, data_dir=tiny_data, output=out, predecoded_dir=pd, device="cpu", min_val_auc=0),
            ]
        )
        == 0
    )  # tiny models near chance
    sym = load_report(out).symbols["ES.FUT"]
    row = sym.models["mamba2"]
    assert [f.fold for f in row.folds] == [0, 1, 2]  # the pipeline's walk-forward plan, a test file in every fold
    # evaluate ends with the report in plain text: each row's Sharpe and DSR as the report has them, and where it is
    printed = capsys.readouterr().out.split("ES.FUT: out of sample over 3 test fold(s)")[-1].splitlines()
    (line,) = [x for x in printed if x.split()[:1] == ["mamba2"]]
    assert line.split()[1] == f"{row.oos.sharpe:,.2f}" and line.split()[4] == f"{row.oos.dsr:,.2f}", line
    assert printed[-1] == f"Full report: {out.with_suffix('.md')} (plots beside it)."
    # one model and two ensembles, each row's policy chosen among 48 on validation
    assert row.n_trials == 3 and row.n_policies == 48 and row.n_configurations == 3 * 48
    assert row.hyperopt_results == [str(results_path.resolve())]
    dispersion = metrics.trials_sharpe_dispersion(
        [t["val_sharpe"] for t in results["trials"]], [t["val_sessions"] for t in results["trials"]]
    )
    assert row.trials_dispersion == dispersion
    for m in (row.oos, *(f.metrics for f in row.folds), *(e.oos for e in sym.ensembles.values())):
        assert m.dsr_n_trials == 9 * 48
        assert m.dsr_variance == pytest.approx(1 / (m.n_sessions - 1) + (dispersion or 0.0))
        assert m.dsr < m.psr or m.psr in (0.0, 1.0)
    md = out.with_suffix(".md").read_text()
    assert "| mamba2 | " in md and " | 9 | " in md and "dsr@null" in md


def _train(bars_dir, pd, out, params, *extra):
    return main(
        [
            "train-supervised",
            *flags(model="mamba2", data_dir=bars_dir, output_dir=out, params_file=params, predecoded_dir=pd),
            *SMALL,
            *extra,
        ]
    )


def test_params_searched_on_a_test_file_are_refused_where_they_are_used(bars, tiny_data, tmp_path, capsys):
    """A trainer refuses a search that trained or validated on one of its test files, naming them; the explicit
    override trains, records the leak in the summary, and the report lists the fold under Excluded."""
    bars_dir, pd, sidecars = bars
    results = _hyperopt("mamba2", bars_dir, pd, tmp_path / "results.json", "--trials", "2")
    test_file = plan_folds([file_ref(sc) for sc in sidecars]).folds[2].test[0].name  # fold 2's test quarter
    from alpha_core.params import search_signature

    leaky = tmp_path / "leaky.json"
    searched = {**results, "val_files": [test_file]}  # a search that did validate on the test file (signed as its own)
    leaky.write_text(json.dumps({**searched, "signature": search_signature(searched)}))
    capsys.readouterr()
    assert _train(bars_dir, pd, tmp_path / "m" / "mamba2" / "ES.FUT", leaky) == 2
    err = capsys.readouterr().err
    assert f"{leaky}: fold 2: test quarter {test_file} was a hyperopt validation quarter" in err and err.count("\n") == 1
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").rglob("summary.json"))
    assert _train(bars_dir, pd, tmp_path / "m" / "mamba2" / "ES.FUT", leaky, "--allow-hyperopt-leakage") == 0
    summary = json.loads((tmp_path / "m" / "mamba2" / "ES.FUT" / "fold-2" / "summary.json").read_text())
    assert summary["hyperopt_leakage"] == [f"fold 2: test quarter {test_file} was a hyperopt validation quarter"]
    report = evaluate(
        EvalConfig(
            models_dir=tmp_path / "m",
            data_dir=tiny_data,
            output=tmp_path / "e" / "r.json",
            predecoded_dir=pd,
            device="cpu",
            gate=GateThresholds(min_val_auc=0.0),
        )
    )
    reasons = {(e.model, e.fold): e.reason for e in report.excluded}
    assert reasons[("mamba2", 2)].startswith("trained with --allow-hyperopt-leakage: fold 2: test quarter")
    assert {f.fold for f in report.symbols["ES.FUT"].models["mamba2"].folds} == {0, 1}


def test_a_nested_search_trains_only_its_own_fold_and_only_its_own_model(bars, tmp_path, capsys):
    bars_dir, pd, sidecars = bars
    nested = tmp_path / "nested.json"
    results = _hyperopt("mamba2", bars_dir, pd, nested, "--trials", "2", "--cv-fold", "1")
    fold = plan_folds([file_ref(sc) for sc in sidecars]).folds[1]
    assert results["train_files"] == [r.name for r in fold.train] and results["val_files"] == [r.name for r in fold.val]
    assert results["cv_fold"] == 1
    capsys.readouterr()
    assert _train(bars_dir, pd, tmp_path / "all", nested) == 2
    assert "a nested search tuned for fold 1 cannot train fold 0" in capsys.readouterr().err
    assert _train(bars_dir, pd, tmp_path / "one", nested, "--cv-fold", "1") == 0
    assert (
        main(
            [
                "train-supervised",
                *flags(model="kan", data_dir=bars_dir, output_dir=tmp_path / "k", params_file=nested, predecoded_dir=pd),
                *SMALL,
                "--cv-fold",
                "1",
            ]
        )
        == 2
    )
    assert "hyperopt results of model 'mamba2' cannot train 'kan'" in capsys.readouterr().err


def _train_fold_0(command: str, model: str, bars, models, *args: str) -> int:
    """`alpha <command>` of fold 0 of a 2-fold plan on the tiny bars, on the CPU, into models/<model>/ES.FUT."""
    bars_dir, pd, _ = bars
    out = models / model / "ES.FUT"
    return main(
        [command, *flags(model=model, data_dir=bars_dir, output_dir=out, predecoded_dir=pd)]
        + [*flags(device="cpu", cv_n_folds=2, cv_fold=0), *args]
    )


@pytest.mark.parametrize("per_epoch", [None, 2])
def test_rl_validation_sharpe_is_the_evaluators(bars, tmp_path, per_epoch):
    """What train-rl reports (and gates and hyperopt score on, and `alpha evaluate` reuses for the ensemble's
    weights) is what `alpha evaluate` computes on that file; also when each epoch scored 2 of its sessions only."""
    sidecars = bars[2]
    models = tmp_path / "models"
    sessions = ["--val-sessions-per-epoch", str(per_epoch)] if per_epoch else []
    assert (
        _train_fold_0(
            "train-rl", "ppo", bars, models, "--epochs", "2", "--timesteps-per-epoch", "512", "--n-envs", "4", *sessions
        )
        == 0
    )
    (ckpt,) = find_checkpoints(models, ["ES.FUT"])[0]
    # the validation quarter, as the evaluator reads it: without the plan's embargo sessions
    val = quarter_sidecars(sidecars, ckpt.summary["embargo_sessions"])[ckpt.summary["val_files"][0]]
    pred = predict(load(ckpt, torch.device("cpu")), val, None, 0, 0.0, scored=False)
    assert pred.position.any()
    assert ckpt.summary["val_sharpe"] == file_score(val, pred.position)[0]
    assert recorded_sharpe(ckpt, val.meta.source.name, 0, 0.0, metrics.DEFAULT_COST_TICKS) == ckpt.summary["val_sharpe"]
    if per_epoch is None:
        assert ckpt.summary["val_sharpe"] == max(ckpt.summary["val_sharpe_per_epoch"])
        assert ckpt.summary["val_sessions_per_epoch"] is None
    else:  # each epoch scored the subset; the kept policy was scored on the whole file after
        assert ckpt.summary["val_sessions_per_epoch"] == 2 < ckpt.summary["val_sessions"]
    assert json.loads((ckpt.path / "env_config.json").read_text())["cost_per_turnover"] == metrics.DEFAULT_COST_TICKS
    # the evaluator reuses it only where it is its own number: another cost or file, no reuse (an agent's actions
    # do not depend on the band or horizon)
    assert recorded_sharpe(ckpt, val.meta.source.name, 0, 0.0, 2.0) is None
    assert recorded_sharpe(ckpt, "another.dbn.zst", 0, 0.0, metrics.DEFAULT_COST_TICKS) is None
    assert recorded_sharpe(ckpt, val.meta.source.name, 1, 0.2, metrics.DEFAULT_COST_TICKS) == ckpt.summary["val_sharpe"]


def test_a_supervised_checkpoint_records_the_evaluators_validation_sharpe(bars, tmp_path):
    """train-supervised records its checkpoint's validation score: what `alpha evaluate` computes from the checkpoint
    on that file, to the bit, at the evaluator's defaults; another band, horizon, cost or file is not reused."""
    sidecars = bars[2]
    models = tmp_path / "models"
    small = flags(epochs=1, seq_len=16, batch_size=64, n_train_seqs=256, n_val_seqs=128)
    assert _train_fold_0("train-supervised", "kan", bars, models, *small) == 0
    (ckpt,) = find_checkpoints(models, ["ES.FUT"], gate=None)[0]
    val_name = ckpt.summary["val_files"][-1]
    # the validation quarter, as the evaluator reads it: without the plan's embargo sessions
    val = quarter_sidecars(sidecars, ckpt.summary["embargo_sessions"])[val_name]
    record = ckpt.summary["val_score"]
    pred = predict(load(ckpt, torch.device("cpu")), val, None, DEFAULT_HORIZON, DEFAULT_BAND, scored=False)
    assert pred.position.any()
    assert (record["sharpe"], record["sessions"]) == file_score(val, pred.position)
    assert (record["file"], record["horizon"], record["band"], record["cost_ticks"], record["device"]) == (
        val_name,
        DEFAULT_HORIZON,
        DEFAULT_BAND,
        metrics.DEFAULT_COST_TICKS,
        "cpu",
    )
    cost = metrics.DEFAULT_COST_TICKS
    assert recorded_sharpe(ckpt, val_name, DEFAULT_HORIZON, DEFAULT_BAND, cost) == record["sharpe"]
    assert recorded_sharpe(ckpt, val_name, DEFAULT_HORIZON, DEFAULT_BAND + 0.01, cost) is None
    assert recorded_sharpe(ckpt, val_name, DEFAULT_HORIZON + 1, DEFAULT_BAND, cost) is None
    assert recorded_sharpe(ckpt, val_name, DEFAULT_HORIZON, DEFAULT_BAND, cost + 1) is None
    assert recorded_sharpe(ckpt, "another.dbn.zst", DEFAULT_HORIZON, DEFAULT_BAND, cost) is None


def test_dsr_is_below_psr_whenever_there_is_more_than_one_trial():
    rng = np.random.default_rng(5)
    for _ in range(200):
        daily = rng.normal(rng.uniform(-0.5, 1.0), 1.0, int(rng.integers(5, 80)))
        psr = metrics.probabilistic_sharpe_ratio(daily)
        if not 0.0 < psr < 1.0:
            continue
        trials = rng.normal(1.0, 3.0, int(rng.integers(2, 40)))
        var = 1 / (len(daily) - 1) + metrics.trials_sharpe_dispersion(trials, np.full(len(trials), 60))
        for n in (2, 7, 100):
            assert metrics.deflated_sharpe_ratio(daily, n, var) < psr
            assert metrics.deflated_sharpe_ratio(daily, n) < psr  # null variance
        assert metrics.deflated_sharpe_ratio(daily, 1, var) == psr


def test_early_stopping_is_one_rule():
    t = Trackers()
    for epoch, sharpe in enumerate([1.0, 2.0, 1.5, 1.9]):
        t.update_sharpe(epoch, sharpe)
    assert (t.best_val_sharpe, t.best_val_sharpe_epoch, t.no_improvement["val_sharpe"]) == (2.0, 1, 2)
    assert t.should_stop("val_sharpe", 2) and not t.should_stop("val_sharpe", 3) and not t.should_stop("val_sharpe", 0)
    assert not t.update_sharpe(4, math.nan) and t.no_improvement["val_sharpe"] == 3


def test_a_search_signs_its_results_and_an_edited_copy_is_refused(tmp_path):
    """The signature covers the lineage, best params and trials: dropping a trial, editing the params or removing
    the signature names the field; an untouched file loads with every trial."""
    from alpha_core.errors import PlanError
    from alpha_core.params import load_params_file, search_signature

    results = {
        "model": "kan",
        "cv_fold": None,
        "train_files": ["a.dbn.zst"],
        "val_files": ["b.dbn.zst"],
        "best_params": {"lr": 0.001},
        "trials": [{"val_sharpe": 1.5, "val_sessions": 10}, {"val_sharpe": -0.5, "val_sessions": 10}],
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps({**results, "signature": search_signature(results)}))
    assert load_params_file(path).hyperopt.trial_sharpes == [1.5, -0.5]
    for change in (
        {"trials": results["trials"][:1]},
        {"best_params": {"lr": 0.01}},
        {"val_files": []},
    ):
        path.write_text(json.dumps({**results, **change, "signature": search_signature(results)}))
        with pytest.raises(PlanError, match=r"results.json: signature: does not match its best_params and trials"):
            load_params_file(path)
    path.write_text(json.dumps(results))
    with pytest.raises(PlanError, match=r"results.json: signature: has no signature"):
        load_params_file(path)
