"""Jobs, per-symbol retraining schedules and the sensor that reacts to newly landed DBN files.

A run has one partitioning, so the lineage is three jobs: `symbol_data` (sidecars, fold plans, hyperopt)
[symbol], `fold_training` (checkpoints) [symbol x fold] and `symbol_report` [symbol]. Each symbol gets its own
weekly schedule (cron from ALPHA_RETRAIN_CRON, America/Chicago). The sensor compares the DBN files under
ALPHA_DATA_DIR with its cursor and, for a symbol with new files, requests its data run and the training run
of every fold (a new quarter moves every walk-forward window).
"""

import json
import os
from pathlib import Path

import dagster as dg

from alpha_assets.data_assets import bar_sidecars, book_sidecars, fold_plans
from alpha_assets.partitions import SYMBOLS, symbol_fold_partitions
from alpha_assets.training_assets import checkpoint_assets, ensemble_report, hyperopt_assets
from alpha_core.data.dbn import DBN_SUFFIXES

RETRAIN_CRON = os.environ.get("ALPHA_RETRAIN_CRON", "0 2 * * 6")  # Saturday 02:00 CT, after the week's last session

# partitioning is inferred from the selected assets
symbol_data_job = dg.define_asset_job("symbol_data", selection=[book_sidecars, bar_sidecars, fold_plans, *hyperopt_assets])
fold_training_job = dg.define_asset_job("fold_training", selection=checkpoint_assets)
symbol_report_job = dg.define_asset_job("symbol_report", selection=[ensemble_report])


def _symbol_schedule(symbol: str) -> dg.ScheduleDefinition:
    @dg.schedule(name=f"retrain_{symbol.replace('.', '_').lower()}", cron_schedule=RETRAIN_CRON,
                 execution_timezone="America/Chicago", job=symbol_data_job,
                 description=f"Weekly retraining of {symbol}: sidecars, fold plans and hyperopt")
    def _schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        return dg.RunRequest(partition_key=symbol, tags={"alpha/trigger": "schedule"})

    return _schedule


def dbn_files(data_root: Path, symbol: str) -> list[str]:
    folder = data_root / symbol
    if not folder.is_dir():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.endswith(DBN_SUFFIXES))


@dg.sensor(name="new_dbn_files", jobs=[symbol_data_job, fold_training_job], minimum_interval_seconds=300,
           description="Requests the sidecars and every fold of a symbol whose DBN folder gained files")
def new_dbn_files(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    data_root = Path(os.environ.get("ALPHA_DATA_DIR", "data/demo"))
    seen = json.loads(context.cursor) if context.cursor else {}
    now = {symbol: dbn_files(data_root, symbol) for symbol in SYMBOLS}
    requests = []
    for symbol, files in now.items():
        new = sorted(set(files) - set(seen.get(symbol, [])))
        if not new:
            continue
        tag = {"alpha/trigger": "new-dbn-files", "alpha/new-files": ",".join(new)[:200]}
        requests.append(dg.RunRequest(job_name="symbol_data", partition_key=symbol, tags=tag,
                                      run_key=f"data-{symbol}-{len(files)}-{new[-1]}"))
        for key in symbol_fold_partitions.get_partition_keys():
            if symbol_fold_partitions.get_partition_key_from_str(key).keys_by_dimension["symbol"] == symbol:
                requests.append(dg.RunRequest(job_name="fold_training", partition_key=key, tags=tag,
                                              run_key=f"train-{key}-{len(files)}-{new[-1]}"))
    if not requests:
        return dg.SkipReason("no new DBN files")
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(now))


schedules = [_symbol_schedule(s) for s in SYMBOLS]
jobs = [symbol_data_job, fold_training_job, symbol_report_job]
