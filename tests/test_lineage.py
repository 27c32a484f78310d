"""The training lineage in Dagster: checkpoints per symbol x fold behind their gate, then the ensemble report.

Partitionings differ, so (as in an asset backfill) every step runs in its own run on one instance. A checkpoint
that misses its gate fails its step, is never materialized, and no later report run can use it.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from alpha_assets.definitions import defs
from alpha_assets.partitions import symbol_fold_key
from alpha_assets.resources import DataRoot, StorageRoot

FAST = {"epochs": 1, "seq_len": 16, "batch_size": 64, "n_train_seqs": 512, "n_val_seqs": 256, "device": "cpu"}


def test_checkpoints_behind_their_gates_then_the_report(tiny_data, tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    resources = {"data": DataRoot(root=str(tiny_data)), "storage": StorageRoot(root=str(tmp_path / "storage"))}
    assets = list(defs.assets)
    by_key = {a.key.to_user_string(): a for a in assets}

    def run(selection, partition, run_config=None, tags=None):
        return dg.materialize(assets, selection=[by_key[s] for s in selection], partition_key=partition,
                              instance=instance, resources=resources, run_config=run_config, raise_on_error=False,
                              tags=tags)

    assert run(["book_sidecars", "bar_sidecars", "fold_plans"], "ES.FUT").success
    for fold in ("0", "1"):
        key = symbol_fold_key("ES.FUT", int(fold))
        ok = run(["checkpoints/mamba2"], key, {"ops": {"checkpoints__mamba2": {"config": {**FAST, "min_val_auc": 0.0}}}})
        assert ok.success
        (check,) = ok.get_asset_check_evaluations()
        assert check.passed and check.check_name == "validation_gate"
        gated = run(["checkpoints/kan"], key, {"ops": {"checkpoints__kan": {"config": {**FAST, "min_val_auc": 0.99}}}})
        assert not gated.success, "a checkpoint below its gate must fail its step"
        assert gated.get_asset_materialization_events() == []

    report = run(["ensemble_report"], "ES.FUT")
    assert report.success
    meta = report.get_asset_materialization_events()[0].materialization.metadata
    used = meta["checkpoints"].value
    assert sorted(u.split(" ")[0] for u in used) == ["mamba2/fold-0", "mamba2/fold-1"], used
    path = Path(meta["path"].value)
    assert path.parent == Path(resources["storage"].root) / report.run_id / "eval" / "ES.FUT"
    body = json.loads(path.read_text())
    assert set(body["symbols"]["ES.FUT"]["models"]) == {"mamba2"}
    assert "| mamba2 |" in meta["report"].value
    for _ in range(2):  # `make demo` twice: a report re-run under the same RUN_ID rebuilds its view
        again = run(["ensemble_report"], "ES.FUT", tags={"alpha/run_id": "rerun"})
        assert again.success
        assert again.get_asset_materialization_events()[0].materialization.metadata["checkpoints"].value == used

    summary = run(["run_summary"], None)
    assert summary.success
    meta = summary.get_asset_materialization_events()[0].materialization.metadata
    assert meta["steps"].value == 2 and meta["gpu_hours"].value == 0.0 and meta["compute_hours"].value > 0
    assert meta["cost_eur"].value == 0.0 and "Full ensemble, 4 symbols" in meta["cost_table"].value
    assert set(meta["symbols"].value) == {"ES.FUT"}
