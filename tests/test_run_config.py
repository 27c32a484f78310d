"""Every run config value and tag is checked where a step uses it: a bad one fails the step at once, in one line
naming the field, is never retried, and writes nothing (no NaN into a summary, no path outside the storage root)."""

from __future__ import annotations

import dagster as dg
import pytest

from alpha_assets.definitions import defs
from alpha_assets.partitions import symbol_fold_key
from alpha_assets.resources import DataRoot, StorageRoot

FAST = {"epochs": 1, "seq_len": 16, "batch_size": 64, "n_train_seqs": 256, "n_val_seqs": 128, "device": "cpu"}


@pytest.fixture(scope="module")
def lineage(tiny_data, tmp_path_factory):
    """An instance with the data assets of ES.FUT materialized, and a runner of one asset partition."""
    storage = tmp_path_factory.mktemp("storage") / "root"
    instance = dg.DagsterInstance.ephemeral()
    resources = {"data": DataRoot(root=str(tiny_data)), "storage": StorageRoot(root=str(storage))}
    assets = list(defs.assets)
    by_key = {a.key.to_user_string(): a for a in assets}

    def run(asset, partition, config=None, tags=None):
        op = asset.replace("/", "__")
        return dg.materialize(
            assets,
            selection=[by_key[asset]],
            partition_key=partition,
            instance=instance,
            resources=resources,
            raise_on_error=False,
            tags=tags or {"alpha/run_id": "checked"},
            run_config={"ops": {op: {"config": config}}} if config is not None else None,
        )

    for asset in ("book_sidecars", "bar_sidecars", "fold_plans"):
        assert run(asset, "ES.FUT").success
    return run, instance, storage


def _failure(result) -> str:
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"], "retried"
    return failure.step_failure_data.error.message


@pytest.mark.parametrize(
    "asset, config, field",
    [
        ("checkpoints/kan", {**FAST, "epochs": 0}, "epochs"),
        ("checkpoints/kan", {**FAST, "seq_len": -5}, "seq_len"),
        ("checkpoints/kan", {**FAST, "min_val_auc": float("nan")}, "min_val_auc"),
        ("checkpoints/kan", {**FAST, "device": "tpu"}, "device"),
        ("checkpoints/ppo", {"epochs": 1, "timesteps_per_epoch": 0}, "timesteps_per_epoch"),
        ("checkpoints/ppo", {"epochs": 1, "min_val_sharpe": float("-inf")}, "min_val_sharpe"),
        ("checkpoints/perception", {**FAST, "precision": "fp8"}, "precision"),
        ("hyperopt/tft", {"trials": 0}, "trials"),
        ("bar_sidecars", {"horizons": list(range(1, 3001))}, "horizons"),
        ("book_sidecars", {"outcome_label_cost": float("nan")}, "outcome_label_cost"),
    ],
)
def test_a_bad_run_config_value_fails_once_in_one_line_naming_it(lineage, asset, config, field):
    run, _, storage = lineage
    partition = symbol_fold_key("ES.FUT", 0) if asset.startswith("checkpoints/") else "ES.FUT"
    result = run(asset, partition, config)
    assert not result.success
    message = _failure(result)
    assert field in message and "\n" not in message.strip() and "Traceback" not in message, message
    assert not list(storage.rglob("summary.json")) and not list(storage.rglob("alpha_train_summary.json"))


@pytest.mark.parametrize("tag", ["../../escaped", "/tmp/absolute", "a/b", ".hidden", "", "predecoded", "PREDECODED"])
def test_a_run_id_tag_that_is_no_folder_name_is_refused_before_anything_is_written(lineage, tmp_path, tag):
    """A folder name, and never one of the storage root's own (`predecoded` would write into the sidecar cache)."""
    run, _, storage = lineage
    before = {p for p in storage.parent.rglob("*")}
    result = run("fold_plans", "ES.FUT", tags={"alpha/run_id": tag})
    assert not result.success
    message = _failure(result)
    expected = "is reserved" if tag.lower() == "predecoded" else "a run id must be 1-64 letters"
    assert "alpha/run_id" in message and expected in message, message
    assert {p for p in storage.parent.rglob("*")} - before == set(), "nothing written, inside or outside the root"
    assert not (storage.parent.parent / "escaped").exists() and not (tmp_path.parent / "escaped").exists()
