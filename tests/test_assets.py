"""Dagster data assets: definitions load, a real materialization per symbol, and the blocking gates."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from alpha_assets.definitions import defs
from alpha_assets.defs.data import INTEGRITY, LEAKAGE, bar_sidecars, book_sidecars, fold_plans
from alpha_assets.resources import DataRoot, StorageRoot

pytestmark = pytest.mark.slow  # Dagster runs, killed processes or a browser: `make check` leaves them out

REPO = Path(__file__).resolve().parents[1]
ASSETS = [book_sidecars, bar_sidecars, fold_plans]


def test_definitions_load():
    defs.resolve_all_job_defs()
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    models = {"perception", "tft", "mamba2", "tggn", "tlob", "liquid", "kan", "xlstm", "diffusion", "dqn", "ppo"}
    assert keys == {
        "raw_dbn",
        "book_sidecars",
        "bar_sidecars",
        "fold_plans",
        "ensemble_report",
        "run_summary",
        "run_comparison",
        *(f"checkpoints/{m}" for m in models),
        *(f"hyperopt/{m}" for m in ("tft", "mamba2", "dqn", "ppo")),
    }
    checks = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert {("book_sidecars", INTEGRITY), ("bar_sidecars", INTEGRITY), ("fold_plans", LEAKAGE)} <= checks
    assert {("checkpoints/kan", "validation_gate")} <= checks
    assert graph.get(dg.AssetKey("fold_plans")).partitions_def.get_partition_keys() == [
        "ES.FUT",
        "NQ.FUT",
        "ZN.FUT",
        "6E.FUT",
    ]


@pytest.fixture
def resources(tiny_data, tmp_path):
    return {"data": DataRoot(root=str(tiny_data)), "storage": StorageRoot(root=str(tmp_path / "storage"))}


def materialize(resources, instance, **kwargs):
    return dg.materialize(ASSETS, partition_key="ES.FUT", resources=resources, instance=instance, **kwargs)


def test_materialize_the_data_of_one_symbol(resources):
    instance = dg.DagsterInstance.ephemeral()
    result = materialize(resources, instance)
    assert result.success
    checks = {(e.asset_key.to_user_string(), e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {("book_sidecars", INTEGRITY): True, ("bar_sidecars", INTEGRITY): True, ("fold_plans", LEAKAGE): True}

    meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    book = meta["book_sidecars"]
    assert book["files"].value == "5" and book["built"].value == "5"  # counts are text: Dagster plots only metrics
    assert int(book["rows"].value) > 10_000
    assert len(book["roll_dates"].value) == 5 and "ESH4->ESM4" in book["roll_dates"].value[0]
    assert book["feature_names"].value[0] == "spread_ticks"
    assert len(book["manifest"].value) == 5
    assert 0.6 < book["oracle_auc"].value["10"] < 1.0, "demo data reports its best achievable AUC"

    plan_path = Path(meta["fold_plans"]["path"].value)
    # a Dagster run without an alpha/run_id tag belongs to the run `default`
    assert plan_path == Path(resources["storage"].root) / "default" / "folds" / "ES.FUT" / "fold_plans.json"
    plans = json.loads(plan_path.read_text())
    assert [len(f["test"]) for f in plans["book"]["folds"]] == [1, 1, 1], "every fold is tested"
    assert meta["fold_plans"]["quarters"].value == ["2024-Q1", "2024-Q2", "2024-Q3", "2024-Q4", "2025-Q1"]
    assert meta["fold_plans"]["gaps"].value == [] and plans["bars"]["units"] == plans["book"]["units"]
    # purge and embargo at the CLI's defaults, recorded for the steps that read the plan; `alpha folds` cuts alike
    from alpha_core.data.dbn import MBP10, OHLCV_1M
    from alpha_core.data.folds import EMBARGO_SESSIONS, PURGE_SESSIONS, plan_folds
    from alpha_core.data.predecode import record_refs

    recorded = (meta["fold_plans"]["purge_sessions"].value, meta["fold_plans"]["embargo_sessions"].value)
    assert recorded == (str(PURGE_SESSIONS), str(EMBARGO_SESSIONS))
    refs = record_refs(resources["data"].symbol_dir("ES.FUT"))
    for kind, schema in (("book", MBP10), ("bars", OHLCV_1M)):
        cli = plan_folds(refs[schema], schema=schema).model_dump()
        assert [(f["purged"], f["val_embargoed"], f["test_embargoed"]) for f in plans[kind]["folds"]] == [
            (f["purged"], f["val_embargoed"], f["test_embargoed"]) for f in cli["folds"]
        ]

    again = materialize(resources, instance)
    book_again = next(e for e in again.get_asset_materialization_events() if e.asset_key.path == ["book_sidecars"])
    assert book_again.materialization.metadata["built"].value == "0", "sidecars are reused across runs"


def test_fold_plans_refuse_schemas_that_disagree_on_a_quarter(tiny_data, tmp_path):
    """Without the bars of 2024-Q3 the bar models and the flagship would be planned on different quarters: the
    fold plans fail, naming the schema and the quarter; a quarter missing from both is planned over, as a gap."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data / "ES.FUT", data / "ES.FUT")
    (data / "ES.FUT" / "ohlcv-1m" / "ES.FUT_2024-Q3.dbn.zst").unlink()
    resources = {"data": DataRoot(root=str(data)), "storage": StorageRoot(root=str(tmp_path / "storage"))}
    result = materialize(resources, dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_key == "fold_plans"
    assert "ohlcv-1m has no files for 2024-Q3 (mbp-10 has)" in failure.event_specific_data.error.message

    (data / "ES.FUT" / "mbp-10" / "ES.FUT_2024-Q3.dbn.zst").unlink()
    (data / "ES.FUT" / "mbp-10" / "ES.FUT_2025-Q1.dbn.zst").unlink()
    (data / "ES.FUT" / "ohlcv-1m" / "ES.FUT_2025-Q1.dbn.zst").unlink()
    result = materialize(resources, dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success  # three quarters are too few for three folds: the message says how many they need
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.event_specific_data.error.message
    assert "mbp-10: 3 quarters (2024-Q1, 2024-Q2, 2024-Q4) are too few for 3 walk-forward folds" in message
    assert "at least 5 calendar quarters" in message


def test_failed_integrity_gate_blocks_fold_plans(resources):
    instance = dg.DagsterInstance.ephemeral()
    assert materialize(resources, instance).success
    # damage one cached sidecar without breaking its format: the integrity gate must catch the content
    cache = Path(resources["storage"].root) / "predecoded" / "ES.FUT"
    target = next(p for p in cache.iterdir() if ".book." in p.name)
    features = np.load(target / "features.npy")
    features[10, 0] = np.nan
    np.save(target / "features.npy", features)

    result = materialize(resources, instance, raise_on_error=False)
    assert not result.success
    failed = [e for e in result.get_asset_check_evaluations() if not e.passed]
    assert [(e.asset_key.to_user_string(), e.check_name) for e in failed] == [("book_sidecars", INTEGRITY)]
    assert "non-finite feature values" in json.dumps(failed[0].metadata["problems"].value)
    ran = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "fold_plans" not in ran


def test_dagster_cli_materializes_everything_for_one_symbol(tiny_data, tmp_path, monkeypatch):
    """What `make demo` runs: the real `dagster asset materialize` CLI against a SQLite instance."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ALPHA_DATA_DIR": str(tiny_data),
        "ALPHA_STORAGE_ROOT": str(tmp_path / "storage"),
        "MAX_PARALLEL": "2",
    }
    dagster = Path(sys.executable).with_name("dagster")
    out = subprocess.run(
        [
            str(dagster),
            "asset",
            "materialize",
            "-m",
            "alpha_assets.definitions",
            "--select",
            "book_sidecars,bar_sidecars,fold_plans",
            "--partition",
            "NQ.FUT",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert list((tmp_path / "storage").glob("*/folds/NQ.FUT/fold_plans.json"))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = dg.DagsterInstance.get()
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("fold_plans"), asset_partitions=["NQ.FUT"]), limit=1
    ).records
    assert records, "the CLI run's materialization is in the instance"


def test_dg_project_loads():
    """`dg dev` / `dg check defs` read the [tool.dg] project settings in pyproject.toml."""
    out = subprocess.run(
        [str(Path(sys.executable).with_name("dg")), "check", "defs"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "All definitions loaded successfully" in out.stdout + out.stderr
