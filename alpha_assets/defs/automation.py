"""Automation: new DBN files -> sidecars -> fold plans; retraining and the report on the weekly retrain cron.

- Jobs: `symbol_data` (a symbol's sidecars, then its fold plans) and `fold_training` (every model's checkpoint
  of one symbol x fold).
- `new_dbn_files` (sensor) compares the DBN files under the data root with its cursor and requests, for a symbol
  whose folder gained files, one `symbol_data` run: its sidecars, then its fold plans in the same run. It never
  requests training, so nothing trains on a fold plan that is being rewritten.
- `automation_conditions` (declarative automation) evaluates the assets' conditions (`alpha_assets.conditions`):
  fold plans follow any new sidecars (`eager`); hyperopt and checkpoints retrain once per RETRAIN_CRON period,
  after all their inputs have been refreshed since the tick and their blocking checks passed
  (`TRAINING_AUTOMATION`); the report follows once every checkpoint has been retrained or has failed since the
  tick (`REPORT_AUTOMATION`).
- `retrain_<symbol>` (one per symbol) retrains that symbol END TO END at each RETRAIN_CRON tick, whether or not
  new data came: one asset backfill of sidecars, fold plans, hyperopt, every fold's checkpoints and the report,
  the same backfill `alpha run` launches (`alpha_assets.lineage`). These are sensors that watch the cron, because
  in Dagster 1.13 a schedule cannot launch a backfill (the schedule daemon ignores
  `RunRequest.for_asset_graph_subset`; only sensors and declarative automation create backfills).

- `fetch_closed_quarter` (sensor) requests one `raw_dbn` run per symbol for each calendar quarter once it has
  closed (its partition appears); turned on, it starts with the next quarter to close: past quarters are
  backfilled per symbol from the UI (raw_dbn's partitions), each costing what `max_cost` allows.

Everything starts stopped: turn it on in the UI (Automation) or with `dagster sensor start`.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import dagster as dg

from alpha_assets.conditions import RETRAIN_CRON, RETRAIN_TIMEZONE
from alpha_assets.dagster_private import latest_completed_cron_tick
from alpha_assets.lineage import asset_graph_subset, lineage
from alpha_assets.partitions import SYMBOLS, quarter_partitions, symbol_quarter_key, symbol_quarter_partitions
from alpha_assets.resources import RUN_ID_TAG, TRIGGER_TAG, DataRoot
from alpha_core.data.dbn import DBN_SUFFIXES
from alpha_core.models import registry

automation_sensor = dg.AutomationConditionSensorDefinition(
    "automation_conditions",
    target=dg.AssetSelection.all(),
    run_tags={TRIGGER_TAG: "automation"},
    description="Evaluates the assets' automation conditions: fold plans after new sidecars, retraining and the "
    f"report once per `{RETRAIN_CRON}` ({RETRAIN_TIMEZONE}) period",
)

symbol_data_job = dg.define_asset_job(
    "symbol_data",
    selection=dg.AssetSelection.assets("book_sidecars", "bar_sidecars", "fold_plans"),
    description="A symbol's sidecars, then its fold plans",
)
raw_dbn_job = dg.define_asset_job(
    "raw_dbn_fetch",
    selection=dg.AssetSelection.assets("raw_dbn"),
    partitions_def=symbol_quarter_partitions,
    description="One quarter of one symbol from Databento (raw_dbn)",
)
fold_training_job = dg.define_asset_job(
    "fold_training",
    selection=dg.AssetSelection.key_prefixes("checkpoints"),
    description="Every model's checkpoint of one symbol x fold",
)


def dbn_files(data: DataRoot, symbol: str) -> list[str]:
    folder = Path(data.root) / symbol  # a symbol without a folder yet simply has no files
    if not folder.is_dir():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.endswith(DBN_SUFFIXES))


@dg.sensor(
    name="new_dbn_files",
    job=symbol_data_job,
    minimum_interval_seconds=300,
    description="A symbol whose DBN folder gained files gets its sidecars and then its fold plans (one run)",
)
def new_dbn_files(context: dg.SensorEvaluationContext, data: DataRoot) -> dg.SensorResult | dg.SkipReason:
    seen = json.loads(context.cursor) if context.cursor else {}
    now = {symbol: dbn_files(data, symbol) for symbol in SYMBOLS}
    requests = []
    for symbol, files in now.items():
        new = sorted(set(files) - set(seen.get(symbol, [])))
        if new:
            tags = {TRIGGER_TAG: "new-dbn-files", "alpha/new-files": ",".join(new)[:200]}
            requests.append(dg.RunRequest(partition_key=symbol, tags=tags, run_key=f"{symbol}-{len(files)}-{new[-1]}"))
    if not requests:
        return dg.SkipReason("no new DBN files")
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(now))


@dg.sensor(
    name="fetch_closed_quarter",
    job=raw_dbn_job,
    minimum_interval_seconds=3600,
    description="Each calendar quarter, once closed: one raw_dbn run per symbol (Databento, bounded by max_cost)",
)
def fetch_closed_quarter(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    closed = quarter_partitions.get_last_partition_key()  # a quarter's partition exists once it has ended
    if context.cursor is None:  # turned on: start with the next quarter to close, never fetch (and pay) for past ones
        return dg.SensorResult(skip_reason=f"first fetch when the quarter after {closed} closes", cursor=closed)
    if closed is None or closed <= context.cursor:
        return dg.SkipReason(f"no quarter closed since {context.cursor}")
    requests = [
        dg.RunRequest(
            partition_key=symbol_quarter_key(symbol, closed),
            run_key=f"raw_dbn-{closed}-{symbol}",
            tags={TRIGGER_TAG: "quarter-closed"},
        )
        for symbol in SYMBOLS
    ]
    return dg.SensorResult(run_requests=requests, cursor=closed)


def latest_tick(now: dt.datetime) -> dt.datetime:
    return latest_completed_cron_tick(RETRAIN_CRON, now, RETRAIN_TIMEZONE)


def retrain_request(symbol: str, tick: dt.datetime, asset_graph) -> dg.RunRequest:
    """One backfill of the symbol's whole lineage, every model, the same targets as `alpha run --phase full`.

    Dagster drops the run config of a sensor's backfill request (`for_asset_graph_subset` sets it to {}), so its
    runs train with the assets' config defaults; `alpha run` is the way to set EPOCHS and the other settings."""
    targets = lineage([symbol], registry.select("all"), "full")
    tags = {RUN_ID_TAG: f"retrain-{symbol.lower()}-{tick:%Y%m%d}", TRIGGER_TAG: "schedule"}
    return dg.RunRequest.for_asset_graph_subset(asset_graph_subset(targets, asset_graph), tags=tags)


def _retrain_sensor(symbol: str) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"retrain_{symbol.replace('.', '_').lower()}",
        minimum_interval_seconds=60,
        description=f"Every `{RETRAIN_CRON}` ({RETRAIN_TIMEZONE}): retrain {symbol} end to end as one backfill "
        "(sidecars, fold plans, hyperopt, every fold's checkpoints, the report)",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        tick = latest_tick(dt.datetime.now(dt.UTC))
        if context.cursor is None:  # turned on: start with the next tick, never retrain for past ones
            return dg.SensorResult(
                skip_reason=f"first retrain after the next {RETRAIN_CRON} tick", cursor=str(tick.timestamp())
            )
        if tick.timestamp() <= float(context.cursor):
            return dg.SkipReason(f"retrained for the {tick:%Y-%m-%d %H:%M %Z} tick")
        return dg.SensorResult(
            run_requests=[retrain_request(symbol, tick, context.repository_def.asset_graph)], cursor=str(tick.timestamp())
        )

    return _sensor


retrain_sensors = [_retrain_sensor(s) for s in SYMBOLS]
sensors = [new_dbn_files, fetch_closed_quarter, automation_sensor, *retrain_sensors]
jobs = [symbol_data_job, raw_dbn_job, fold_training_job]


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(jobs=jobs, sensors=sensors)
