"""The training lineage in Dagster: checkpoints per symbol x fold behind their gate, then the ensemble report.

Partitionings differ, so (as in an asset backfill) every step runs in its own run on one instance. A checkpoint
that misses its gate records a failed blocking check, fails its step with the reason (no materialization: the
partition is Failed) and stays unpromoted: no report, in that run or later, uses it, even when a later run under
the same RUN_ID fails where an earlier one passed.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import dagster as dg
import pytest
from safetensors.torch import load_file

from alpha_assets.definitions import defs
from alpha_assets.partitions import symbol_fold_key
from alpha_assets.resources import DataRoot, StorageRoot
from alpha_core import artifacts

pytestmark = pytest.mark.slow  # Dagster runs, killed processes or a browser: `make check` leaves them out

FAST = {"epochs": 1, "seq_len": 16, "batch_size": 64, "n_train_seqs": 512, "n_val_seqs": 256, "device": "cpu"}
RUN_ID = {"alpha/run_id": "shared"}


def plotted(metadata) -> set[str]:
    """The entries Dagster plots: Int and Float metadata (a bool is neither)."""
    return {key for key, value in metadata.items() if type(value.value) in (int, float)}


def test_gates_promotion_and_a_complete_report(tiny_data, tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    storage = tmp_path / "storage"
    resources = {"data": DataRoot(root=str(tiny_data)), "storage": StorageRoot(root=str(storage))}
    assets = list(defs.assets)
    by_key = {a.key.to_user_string(): a for a in assets}

    def run(selection, partition, run_config=None, tags=RUN_ID):
        return dg.materialize(
            assets,
            selection=[by_key[s] for s in selection],
            partition_key=partition,
            instance=instance,
            resources=resources,
            run_config=run_config,
            raise_on_error=False,
            tags=tags,
        )

    def train(model, fold, min_auc):
        config = {"ops": {f"checkpoints__{model}": {"config": {**FAST, "min_val_auc": min_auc}}}}
        return run([f"checkpoints/{model}"], symbol_fold_key("ES.FUT", fold), config)

    data = run(["book_sidecars", "bar_sidecars", "fold_plans"], "ES.FUT")
    assert data.success
    for event in data.get_asset_materialization_events():  # counts, not metrics: shown as text, never plotted
        assert not plotted(event.materialization.metadata), (event.asset_key, plotted(event.materialization.metadata))
    passing = {}
    for fold in (0, 1):
        ok = train("mamba2", fold, 0.0)
        assert ok.success
        (check,) = ok.get_asset_check_evaluations()
        assert check.passed and check.check_name == "validation_gate"
        assert {"metric", "value", "threshold", "partition"} <= set(check.metadata)
        where = f"[ES.FUT fold {fold}, run shared]"  # one series a fold and run: two runs never join into one line
        assert plotted(check.metadata) == {f"mean_val_auc {where}"}, "the metric only, one series a fold"
        meta = ok.get_asset_materialization_events()[0].materialization.metadata
        assert f"val_auc_h5 {where}" in plotted(meta)  # no epochs, wall time or threshold among them
        assert all(key.endswith(f" {where}") for key in plotted(meta)), plotted(meta)
        assert "](data:image/png;base64," in meta["curves"].value and "tensorboard --logdir" in meta["tensorboard"].value
        passing[fold] = ok.run_id
        gated = train("kan", fold, 0.99)
        assert not gated.success, "a missed gate fails the run"
        (check,) = gated.get_asset_check_evaluations()
        assert not check.passed and float(check.metadata["threshold"].value) == 0.99
        assert check.metadata["partition"].value == f"ES.FUT|{fold}"
        # a missed gate is a failed partition: no materialization, and the step's error is the one-line reason
        assert not gated.get_asset_materialization_events()
        (failure,) = [e for e in gated.all_events if e.event_type_value == "STEP_FAILURE"]
        description = failure.step_failure_data.user_failure_data.description
        assert description.startswith(f"kan ES.FUT fold {fold} not promoted: validation_gate missed, mean validation AUC")
        assert "<= 0.99" in description and "\n" not in description
        tag = instance.get_run_by_id(gated.run_id).tags["alpha/gate/kan"]  # the runs list shows it
        assert tag.startswith("missed: AUC 0.") and tag.endswith(" <= 0.99"), tag
        assert not (storage / "shared" / "models" / "kan" / "ES.FUT" / f"fold-{fold}").exists(), "never promoted"

    # another run plans its folds later: this run's steps keep training on this run's plans
    assert run(["fold_plans"], "ES.FUT", tags={"alpha/run_id": "other"}).success
    again = train("mamba2", 1, 0.0)
    assert again.success
    assert again.get_asset_materialization_events()[0].materialization.metadata["plans_run"].value == "shared"
    passing[1] = again.run_id

    fold0 = storage / "shared" / "models" / "mamba2" / "ES.FUT" / "fold-0"
    weights = load_file(str(fold0 / "model.safetensors"))
    assert artifacts.promoted(fold0).id == passing[0]
    # the same RUN_ID again, now below its gate: nothing a reader sees may change
    rerun = train("mamba2", 0, 0.99)
    assert not rerun.success
    (check,) = rerun.get_asset_check_evaluations()
    assert not check.passed and check.target_materialization_data is None, "it never marks the passing attempt failed"
    assert artifacts.promoted(fold0).id == passing[0]
    assert all((load_file(str(fold0 / "model.safetensors"))[k] == v).all() for k, v in weights.items())

    report = run(["ensemble_report"], "ES.FUT", {"ops": {"ensemble_report": {"config": {"models": ["mamba2", "kan", "tft"]}}}})
    assert report.success
    meta = report.get_asset_materialization_events()[0].materialization.metadata
    used = [r.data for r in meta["used"].value.records]
    assert [(u["model"], u["fold"], u["run_id"]) for u in used] == [("mamba2", 0, passing[0]), ("mamba2", 1, passing[1])]
    path = Path(meta["path"].value)
    body = json.loads(path.read_text())
    assert set(body["symbols"]["ES.FUT"]["models"]) == {"mamba2"}
    reasons = {(e["model"], e["fold"]): e["reason"] for e in body["excluded"]}
    assert reasons[("tft", 0)] == "never materialized" and reasons[("mamba2", 2)] == "never materialized"
    assert reasons[("kan", 1)].startswith("gate failed: mean validation AUC")
    assert len(reasons) == 3 * 3 - 2, "every requested model x fold is reported or excluded"
    brief = meta["left out"].value  # Excluded on the page's first screen, in one line
    assert brief.startswith("7 left out. ") and "tft fold 0, 1, 2: never materialized" in brief
    assert "kan fold 1: gate failed: mean validation AUC" in brief
    (check,) = report.get_asset_check_evaluations()
    assert check.passed and check.check_name == "report_complete"
    assert "![ES.FUT: out-of-sample equity and drawdown by session](data:image/png;base64," in meta["plot"].value
    equity = meta["equity"].value  # the equal-weight ensemble's curve, short enough to show without a click
    assert equity.startswith("equal_weight: equity (green) and drawdown (red)") and len(equity) < 1000
    svg = base64.b64decode(equity.split("data:image/svg+xml;base64,")[1].rstrip(")")).decode()
    assert svg.startswith("<svg") and svg.count("<polyline") == 2
    rows = {r.data["row"]: r.data for r in meta["results"].value.records}
    assert rows["mamba2"]["dsr_n"] >= 1 and "sessions" in rows["mamba2"]
    headline = meta["headline"].value.splitlines()
    assert headline[0] == "| model | sessions | Sharpe | 95% CI | DSR | max DD | PnL |"
    assert [line.split(" | ")[0] for line in headline[2:]] == ["| mamba2", "| **equal_weight**", "| **validation_weighted**"]
    assert len(meta["headline"].value) < 1000, "Dagster shows Markdown of under 1,000 characters on the page itself"
    assert plotted(meta) == {"sharpe [ES.FUT]", "dsr [ES.FUT]"}
    assert meta["plotted"].value.endswith("the equal-weight ensemble's, one point per report"), (
        "every plotted number says whose"
    )

    for _ in range(2):  # `make demo` twice: a report re-run under the same RUN_ID rebuilds its view
        again = run(["ensemble_report"], "ES.FUT", {"ops": {"ensemble_report": {"config": {"models": ["mamba2"]}}}})
        assert again.success
        again_meta = again.get_asset_materialization_events()[0].materialization.metadata
        assert [r.data for r in again_meta["used"].value.records] == used

    # a second run is a unit of its own: without asking, it never scores the first run's checkpoints
    models = {"ops": {"ensemble_report": {"config": {"models": ["mamba2", "kan"]}}}}
    second = run(["ensemble_report"], "ES.FUT", models, tags={"alpha/run_id": "second"})
    assert not second.success, "no checkpoint of run `second` passed its gate"
    (failure,) = [e for e in second.all_events if e.event_type_value == "STEP_FAILURE"]
    excluded = {
        (e["model"], e["fold"]): e["reason"] for e in failure.step_failure_data.user_failure_data.metadata["excluded"].value
    }
    assert excluded[("mamba2", 0)] == "not trained in run second (run shared has one: --reuse-from shared to use it)"
    assert excluded[("kan", 0)] == "never materialized", "the other run's gate misses are not this run's either"
    assert not (storage / "second" / "eval" / "ES.FUT" / "ensemble_report.json").exists()
    # asked for by name, the first run's checkpoints are used, and every door names the run they came from
    reused = run(["ensemble_report"], "ES.FUT", models, tags={"alpha/run_id": "second", "alpha/reuse_from": "shared"})
    assert reused.success
    meta = reused.get_asset_materialization_events()[0].materialization.metadata
    assert meta["run"].value == "second" and meta["verdict"].value.startswith("Verdict: ")
    assert {(r.data["model"], r.data["run"]) for r in meta["used"].value.records} == {("mamba2", "shared")}
    body = json.loads((storage / "second" / "eval" / "ES.FUT" / "ensemble_report.json").read_text())
    assert body["run_id"] == "second" and set(body["reused"]) == {"mamba2 fold 0", "mamba2 fold 1"}
    assert body["reused"]["mamba2 fold 0"] == f"run shared (attempt {passing[0]})"
    markdown = (storage / "second" / "eval" / "ES.FUT" / "ensemble_report.md").read_text()
    assert "Reused by name: mamba2 fold 0 from run shared" in markdown
    reasons = {(e["model"], e["fold"]): e["reason"] for e in body["excluded"]}
    assert reasons[("kan", 1)].startswith("gate failed in run shared: mean validation AUC")

    # the UI's comparison of the two runs: the same text as `alpha compare shared second`
    compared = run(["run_comparison"], None, {"ops": {"run_comparison": {"config": {"runs": ["shared", "second"]}}}})
    assert compared.success
    text = compared.get_asset_materialization_events()[0].materialization.metadata["comparison"].value
    assert "ES.FUT: out-of-sample Sharpe (DSR) per run" in text and "setting(s) differ" in text

    summary = run(["run_summary"], None)
    assert summary.success
    meta = summary.get_asset_materialization_events()[0].materialization.metadata
    assert meta["steps"].value >= 2 and meta["gpu_hours"].value == 0.0 and meta["compute_hours"].value > 0
    assert meta["cpu_hours"].value == meta["compute_hours"].value  # priced at the CPU node rate, not free
    assert meta["cost_eur"].value == pytest.approx(meta["cpu_hours"].value * 0.5)
    assert "Full ensemble, 4 symbols" in meta["cost_table"].value
    assert set(meta["symbols"].value) == {"ES.FUT"}
