"""One answer from every door: the same checkpoints give the same out-of-sample report, with the same N, V and
DSR, from Dagster's `ensemble_report` and from `alpha evaluate` over the run's models folder, and every door
plans the same folds."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from alpha_assets.definitions import defs
from alpha_assets.partitions import N_FOLDS, symbol_fold_key
from alpha_assets.resources import DataRoot, StorageRoot
from alpha_core.cli import main
from alpha_core.eval.report import load_report

pytestmark = pytest.mark.slow  # Dagster runs, killed processes or a browser: `make check` leaves them out

FAST = {
    "epochs": 1,
    "seq_len": 16,
    "batch_size": 64,
    "n_train_seqs": 256,
    "n_val_seqs": 128,
    "device": "cpu",
    "min_val_auc": 0.0,
}
SEARCH = {"trials": 3, "epochs": 1, "seq_len": 16, "batch_size": 64, "n_train_seqs": 128, "n_val_seqs": 96, "device": "cpu"}


def test_dagster_and_the_cli_report_the_same_checkpoints_alike(tiny_data, tmp_path):
    storage = tmp_path / "storage"
    instance = dg.DagsterInstance.ephemeral()
    resources = {"data": DataRoot(root=str(tiny_data)), "storage": StorageRoot(root=str(storage))}
    assets = list(defs.assets)
    by_key = {a.key.to_user_string(): a for a in assets}

    def run(asset, partition, config=None):
        op = asset.replace("/", "__")
        result = dg.materialize(
            assets,
            selection=[by_key[asset]],
            partition_key=partition,
            instance=instance,
            resources=resources,
            tags={"alpha/run_id": "doors"},
            run_config={"ops": {op: {"config": config}}} if config else None,
        )
        assert result.success
        return result

    for asset in ("book_sidecars", "bar_sidecars"):
        run(asset, "ES.FUT")
    run("fold_plans", "ES.FUT", {"purge_sessions": 1, "embargo_sessions": 1})  # set once, in the plan
    run("hyperopt/mamba2", "ES.FUT", SEARCH)
    for fold in range(N_FOLDS):
        for model in ("mamba2", "kan"):
            run(f"checkpoints/{model}", symbol_fold_key("ES.FUT", fold), FAST)
    run("ensemble_report", "ES.FUT", {"models": ["mamba2", "kan"]})
    dagster = load_report(storage / "doors" / "eval" / "ES.FUT" / "ensemble_report.json").symbols["ES.FUT"]

    out = tmp_path / "cli" / "ensemble_report.json"
    assert (
        main(
            [
                "evaluate",
                "--models-dir",
                str(storage / "doors" / "models"),
                "--data-dir",
                str(tiny_data),
                "--output",
                str(out),
                "--predecoded-dir",
                str(storage / "predecoded"),
                "--device",
                "cpu",
                "--min-val-auc",
                "0",
                "--embargo-sessions",  # the CLI's door to the same plan setting
                "1",
            ]
        )
        == 0
    )
    cli = load_report(out).symbols["ES.FUT"]

    # the fold plan's purge and embargo reached every checkpoint (the search, the trainers) and both reports scored
    # the test quarters without their first session: 2 of the tiny scale's 3
    summaries = sorted((storage / "doors" / "models").glob("*/ES.FUT/fold-*/*summary*.json"))
    assert len(summaries) == 2 * N_FOLDS
    for path in summaries:
        summary = json.loads(path.read_text())
        assert (summary["purge_sessions"], summary["embargo_sessions"]) == (1, 1), path
    rows = {**dagster.models, **dagster.ensembles}
    assert all(f.metrics.n_sessions == 2 for row in rows.values() for f in row.folds)
    assert set(rows) == {"mamba2", "kan", "equal_weight", "validation_weighted"}
    assert rows["mamba2"].n_trials == 3 and [f.fold for f in rows["mamba2"].folds] == [0, 1, 2]
    for name, row in rows.items():
        other = {**cli.models, **cli.ensembles}[name]
        assert (row.n_trials, row.n_configurations, row.trials_dispersion, row.dsr_estimator) == (
            other.n_trials,
            other.n_configurations,
            other.trials_dispersion,
            other.dsr_estimator,
        ), name
        assert row.oos.model_dump() == other.oos.model_dump(), name  # Sharpe, N, V, DSR, DSR@null, all of it
        assert [f.metrics for f in row.folds] == [f.metrics for f in other.folds], name
        # the same decision policy per checkpoint from both doors: the one fitted on its validation file
        assert [f.policy for f in row.folds] == [f.policy for f in other.folds], name
        assert all(f.policy is not None and f.policy.name == "fitted" for f in row.folds if f.weights is None), name
