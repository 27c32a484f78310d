"""`alpha run`: the spec's CI trigger (SYMBOLS, MODELS, PHASE, MAX_PARALLEL, EPOCHS, HYPEROPT_TRIALS, RUN_ID) as
Dagster runs, in this process against $DAGSTER_HOME, or with `--remote URL` on a running Dagster through GraphQL.

A run has one partitioning, so the lineage becomes ordered steps per symbol: the data assets [symbol], then
hyperopt [symbol], one training run per fold [symbol x fold] and the report [symbol]. Every step is tagged
with the RUN_ID, so all artifacts land under `{storage}/<RUN_ID>/` as in the spec's `/output/<RUN_ID>/`. A step
that fails (a checkpoint below its gate) is reported and the rest goes on; the exit status is non-zero.
"""

import datetime as dt
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import dagster as dg

from alpha_assets.partitions import symbol_fold_partitions
from alpha_assets.resources import RUN_ID_TAG
from alpha_core.models import registry

PHASES = ("hyperopt", "train", "eval", "full")
DATA_ASSETS = ("book_sidecars", "bar_sidecars", "fold_plans")


@dataclass
class Step:
    name: str
    assets: list[dg.AssetKey]
    partition: str
    run_config: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)


def plan(symbols: list[str], models: str, phase: str, epochs: int, trials: int, run_id: str,
         train_config: dict | None = None, hyperopt_config: dict | None = None) -> list[Step]:
    if phase not in PHASES:
        raise ValueError(f"PHASE must be one of {', '.join(PHASES)} (got {phase!r})")
    names = registry.select(models)
    searchable = [m for m in names if registry.get(m).search_space is not None]
    tags = {RUN_ID_TAG: run_id, "alpha/trigger": "alpha-run"}
    steps = []
    for symbol in symbols:
        steps.append(Step(f"data {symbol}", [dg.AssetKey(a) for a in DATA_ASSETS], symbol, tags=tags))
        if phase in ("hyperopt", "full") and searchable:
            cfg = {f"hyperopt__{m}": {"config": {"trials": trials, **(hyperopt_config or {})}} for m in searchable}
            steps.append(Step(f"hyperopt {symbol}", [dg.AssetKey(["hyperopt", m]) for m in searchable], symbol,
                              {"ops": cfg}, tags))
        if phase in ("train", "full"):
            cfg = {f"checkpoints__{m}": {"config": {"epochs": epochs, **(train_config or {})}} for m in names}
            for key in symbol_fold_partitions.get_partition_keys():
                dims = symbol_fold_partitions.get_partition_key_from_str(key).keys_by_dimension
                if dims["symbol"] == symbol:
                    part_tags = {**tags, "dagster/partition/symbol": symbol, "dagster/partition/fold": dims["fold"]}
                    steps.append(Step(f"train {symbol} fold {dims['fold']}",
                                      [dg.AssetKey(["checkpoints", m]) for m in names], key, {"ops": cfg}, part_tags))
        if phase in ("eval", "full"):
            steps.append(Step(f"report {symbol}", [dg.AssetKey("ensemble_report")], symbol, tags=tags))
    return steps


def run_local(steps: list[Step]) -> bool:
    from alpha_assets.definitions import defs
    from alpha_assets.resources import default_resources

    assets = list(defs.assets)
    resources = default_resources()
    by_key = {a.key: a for a in assets}
    instance = dg.DagsterInstance.get()
    ok = True
    for step in steps:
        started = time.perf_counter()
        partition = (symbol_fold_partitions.get_partition_key_from_str(step.partition) if "|" in step.partition
                     else step.partition)
        result = dg.materialize(assets, selection=[by_key[k] for k in step.assets], partition_key=partition,
                                instance=instance, resources=resources, run_config=step.run_config, tags=step.tags,
                                raise_on_error=False)
        ok &= result.success
        print(f"{'ok    ' if result.success else 'FAILED'} {step.name} ({time.perf_counter() - started:.0f} s, "
              f"run {result.run_id})", flush=True)
    return ok


def run_remote(url: str, steps: list[Step], poll_s: float = 2.0, location: str = "alpha") -> bool:
    from dagster_graphql import DagsterGraphQLClient

    parsed = urlparse(url if "//" in url else f"http://{url}")
    client = DagsterGraphQLClient(parsed.hostname, port_number=parsed.port, use_https=parsed.scheme == "https")
    ok = True
    for step in steps:
        run_id = client.submit_job_execution(
            "__ASSET_JOB", repository_location_name=location, run_config=step.run_config or None,
            asset_selection=[k.path for k in step.assets], tags={**step.tags, "dagster/partition": step.partition},
        )
        started = time.perf_counter()
        while (status := client.get_run_status(run_id)) not in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE,
                                                               dg.DagsterRunStatus.CANCELED):
            time.sleep(poll_s)
        ok &= status == dg.DagsterRunStatus.SUCCESS
        print(f"{'ok    ' if status == dg.DagsterRunStatus.SUCCESS else 'FAILED'} {step.name} "
              f"({time.perf_counter() - started:.0f} s, run {run_id}, {status.value})", flush=True)
    return ok


def default_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")


def describe(steps: list[Step]) -> str:
    return json.dumps([{"step": s.name, "partition": s.partition, "assets": [k.to_user_string() for k in s.assets]}
                       for s in steps], indent=2)
