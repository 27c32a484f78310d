"""Automation, evaluated as the daemon would: the new-DBN-files sensor, the declarative conditions, the weekly retrain."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import dagster as dg

from alpha_assets.conditions import RETRAIN_CRON
from alpha_assets.definitions import defs
from alpha_assets.defs.automation import latest_tick, new_dbn_files, retrain_sensors
from alpha_assets.partitions import SYMBOLS, symbol_fold_keys
from alpha_assets.resources import DataRoot, StorageRoot
from alpha_core.models import registry

ES = "ES.FUT"
SEARCHABLE = [m for m in registry.select("all") if registry.get(m).search_space is not None]


def requested(result) -> dict[str, set[str]]:
    graph = defs.resolve_asset_graph()
    out = {}
    for key in graph.get_all_asset_keys():
        partitions = result.get_requested_partitions(key)
        if partitions:
            out[key.to_user_string()] = set(partitions)
    return out


def test_new_dbn_files_requests_the_data_run_and_never_training(tiny_data, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(tiny_data / ES, root / ES)
    instance = dg.DagsterInstance.ephemeral()

    def tick(cursor=None):
        return new_dbn_files(
            dg.build_sensor_context(instance=instance, cursor=cursor, resources={"data": DataRoot(root=str(root))})
        )

    job = defs.resolve_job_def("symbol_data")
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == {"book_sidecars", "bar_sidecars", "fold_plans"}
    first = tick()
    assert [(r.partition_key, r.job_name) for r in first.run_requests] == [(ES, None)]  # the sensor's job only
    assert first.run_requests[0].tags["alpha/trigger"] == "new-dbn-files"
    cursor = first.cursor
    assert len(json.loads(cursor)[ES]) == 10
    assert isinstance(tick(cursor), dg.SkipReason)

    shutil.copytree(tiny_data / "NQ.FUT", root / "NQ.FUT")
    shutil.copy(root / ES / "mbp-10" / "ES.FUT_2025-Q1.dbn.zst", root / ES / "mbp-10" / "ES.FUT_2025-Q2.dbn.zst")
    third = tick(cursor)
    assert sorted(r.partition_key for r in third.run_requests) == [ES, "NQ.FUT"]
    es = next(r for r in third.run_requests if r.partition_key == ES)
    assert es.tags["alpha/new-files"] == "mbp-10/ES.FUT_2025-Q2.dbn.zst"


def test_fold_plans_follow_new_sidecars_and_the_lineage_retrains_after_the_cron_tick(tiny_data, tmp_path):
    """Real materializations (in-process runs); the automation sensor's evaluations at chosen times around a tick."""
    instance = dg.DagsterInstance.ephemeral()
    resources = {"data": DataRoot(root=str(tiny_data)), "storage": StorageRoot(root=str(tmp_path / "storage"))}
    assets = list(defs.assets)
    by_key = {a.key.to_user_string(): a for a in assets}

    def materialize(*names):
        result = dg.materialize(
            assets, selection=[by_key[n] for n in names], partition_key=ES, instance=instance, resources=resources
        )
        assert result.success

    tick = latest_tick(dt.datetime.now(dt.UTC))
    cursor = None

    def evaluate(at: dt.datetime) -> dict[str, set[str]]:
        nonlocal cursor
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, evaluation_time=at, cursor=cursor)
        cursor = result.cursor
        return requested(result)

    assert evaluate(tick - dt.timedelta(hours=3)) == {}  # nothing materialized: nothing to follow

    materialize("book_sidecars", "bar_sidecars")  # what new_dbn_files' run starts with
    assert evaluate(tick - dt.timedelta(hours=2)) == {"fold_plans": {ES}}, "fold plans follow new sidecars"
    materialize("fold_plans")
    assert evaluate(tick - dt.timedelta(hours=1)) == {}, "training waits for the retrain cron"

    assert evaluate(tick + dt.timedelta(minutes=1)) == {}, "after the tick: nothing refreshed since, nothing retrains"

    materialize("book_sidecars", "bar_sidecars")  # data refreshed after the tick: the lineage retrains
    assert evaluate(tick + dt.timedelta(minutes=2)) == {"fold_plans": {ES}, **{f"hyperopt/{m}": {ES} for m in SEARCHABLE}}
    materialize("fold_plans")  # (hyperopt left out: checkpoints of a model without a search space follow anyway)
    after = evaluate(tick + dt.timedelta(minutes=3))
    without_search = {f"checkpoints/{m}": set(symbol_fold_keys(ES)) for m in registry.select("all") if m not in SEARCHABLE}
    assert after == without_search, "every fold of every model whose inputs were refreshed since the tick"
    assert evaluate(tick + dt.timedelta(minutes=4)) == {}, "requested once per cron period"


def test_the_report_follows_once_every_checkpoint_retrained_or_failed_since_the_tick():
    """REPORT_AUTOMATION on a two-asset stand-in of the lineage (checkpoints -> report): a fold below its gate must
    not hold the report back, and the report waits for every fold to have been attempted."""
    from alpha_assets.conditions import REPORT_AUTOMATION
    from alpha_assets.partitions import split_symbol_fold, symbol_fold_partitions, symbol_partitions

    @dg.asset(partitions_def=symbol_fold_partitions)
    def checkpoint(context) -> None:
        if split_symbol_fold(context.partition_key)[1] == 2:
            raise dg.Failure("below its gate")

    @dg.asset(
        partitions_def=symbol_partitions,
        automation_condition=REPORT_AUTOMATION,
        deps=[dg.AssetDep(checkpoint, partition_mapping=dg.MultiToSingleDimensionPartitionMapping("symbol"))],
    )
    def report() -> None: ...

    instance = dg.DagsterInstance.ephemeral()
    tick = latest_tick(dt.datetime.now(dt.UTC))
    cursor = None

    def evaluate(at: dt.datetime) -> set[str]:
        nonlocal cursor
        result = dg.evaluate_automation_conditions(
            defs=[checkpoint, report], instance=instance, evaluation_time=at, cursor=cursor
        )
        cursor = result.cursor
        return set(result.get_requested_partitions(report.key))

    assert evaluate(tick - dt.timedelta(hours=1)) == set()
    assert evaluate(tick + dt.timedelta(minutes=1)) == set()
    for key in symbol_fold_keys(ES)[:2]:
        assert dg.materialize([checkpoint], partition_key=key, instance=instance).success
    assert evaluate(tick + dt.timedelta(minutes=2)) == set(), "fold 2 has not been attempted yet"
    assert not dg.materialize(
        [checkpoint], partition_key=symbol_fold_keys(ES)[2], instance=instance, raise_on_error=False
    ).success
    assert evaluate(tick + dt.timedelta(minutes=3)) == {ES}
    assert evaluate(tick + dt.timedelta(minutes=4)) == set(), "once per cron period"


def test_each_symbol_retrains_end_to_end_as_one_backfill_at_the_cron():
    assert [s.name for s in retrain_sensors] == [f"retrain_{s.replace('.', '_').lower()}" for s in SYMBOLS]
    sensor = retrain_sensors[0]
    assert RETRAIN_CRON in sensor.description
    tick = latest_tick(dt.datetime.now(dt.UTC))

    def evaluate(cursor):
        return sensor(dg.build_sensor_context(cursor=cursor, definitions=defs))

    first = evaluate(None)  # just turned on: waits for the next tick
    assert first.run_requests == [] and float(first.cursor) == tick.timestamp()
    assert isinstance(evaluate(str(tick.timestamp())), dg.SkipReason)

    due = evaluate(str((tick - dt.timedelta(days=7)).timestamp()))
    (request,) = due.run_requests
    assert request.requires_backfill_daemon() and float(due.cursor) == tick.timestamp()
    subset = request.asset_graph_subset
    partitions = {k.to_user_string(): set(subset.get_partitions_subset(k).get_partition_keys()) for k in subset.asset_keys}
    folds = set(symbol_fold_keys(ES))
    assert partitions == {
        "book_sidecars": {ES},
        "bar_sidecars": {ES},
        "fold_plans": {ES},
        **{f"hyperopt/{m}": {ES} for m in SEARCHABLE},
        **{f"checkpoints/{m}": folds for m in registry.select("all")},
        "ensemble_report": {ES},
    }
    assert request.tags == {"alpha/run_id": f"retrain-es.fut-{tick:%Y%m%d}", "alpha/trigger": "schedule"}


def test_the_asset_graph_is_the_same_whatever_the_environment():
    """Definitions load with no ALPHA_* variable set, and the old overrides no longer change the graph."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    show = (
        "from alpha_assets.definitions import defs; g = defs.resolve_asset_graph(); "
        "print(sorted((k.to_user_string(), tuple(g.get(k).partitions_def.get_partition_keys()) "
        "if g.get(k).partitions_def else ()) for k in g.get_all_asset_keys()))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHA_")}
    env |= {"ALPHA_SYMBOLS": "ES.FUT", "ALPHA_CV_N_FOLDS": "5", "ALPHA_MODELS": "kan", "ALPHA_RETRAIN_CRON": "0 * * * *"}
    out = subprocess.run(
        [sys.executable, "-c", show],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    graph = defs.resolve_asset_graph()
    here = sorted(
        (k.to_user_string(), tuple(graph.get(k).partitions_def.get_partition_keys()) if graph.get(k).partitions_def else ())
        for k in graph.get_all_asset_keys()
    )
    assert out.stdout.strip() == str(here)
    # raw_dbn, sidecars x2, fold plans; the report, the run summary and the comparison of runs
    assert len(here) == 4 + len(SEARCHABLE) + len(registry.select("all")) + 3
    assert dict(here)["checkpoints/kan"] == tuple(k for s in SYMBOLS for k in symbol_fold_keys(s))
