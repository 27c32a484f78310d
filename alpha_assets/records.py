"""What earlier steps recorded, as the training lineage's steps read it: a partition's materializations and failed
gate checks, scoped to the pipeline run (`alpha_run` in every record; docs/pipeline.md, "A run is a unit")."""

import dagster as dg

from alpha_assets.dagster_private import failed_check_evaluations
from alpha_assets.partitions import symbol_fold_key
from alpha_assets.resources import runs_in_scope
from alpha_core.gates import GATE_CHECK

ALPHA_RUN = "alpha_run"  # metadata key: the pipeline RUN_ID a materialization or check belongs to


def materializations(context: dg.AssetExecutionContext, key: dg.AssetKey, partition: str, limit: int = 1) -> list[dict]:
    """The metadata of the newest materializations of one partition, newest first."""
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=limit, ascending=False
    ).records
    return [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in records]


def latest_metadata(context: dg.AssetExecutionContext, key: dg.AssetKey, partition: str) -> dict | None:
    found = materializations(context, key, partition)
    return found[0] if found else None


def run_metadata(context: dg.AssetExecutionContext, key: dg.AssetKey, partition: str) -> dict | None:
    """The newest materialization of a partition by this run, else by the first run it reuses that has one."""
    found = materializations(context, key, partition, limit=100)
    for run in runs_in_scope(context):
        for meta in found:
            if meta.get(ALPHA_RUN) == run:
                return meta
    return None


def passing_checkpoint(context: dg.AssetExecutionContext, model: str, symbol: str, fold: int) -> tuple[dict | None, str]:
    """The newest attempt of a partition that passed its gate in this run (else in a run it reuses by name), or None
    and why there is none.

    Only attempts whose gate passed (and which were therefore promoted) count, so a later gate-failed attempt under
    the same RUN_ID never changes what a report evaluates; an attempt of another run counts only when reused by name.
    """
    key, partition = dg.AssetKey(["checkpoints", model]), symbol_fold_key(symbol, fold)
    found = materializations(context, key, partition, limit=100)
    runs = runs_in_scope(context)
    for run in runs:
        for meta in found:
            if meta.get(ALPHA_RUN) == run and meta.get("gate_passed") is True:
                return meta, ""
        missed = gate_miss(context.instance, key, partition, run)
        if missed is not None:
            return None, f"gate failed: {missed}" if run == runs[0] else f"gate failed in run {run}: {missed}"
    others = sorted({str(m.get(ALPHA_RUN, "before runs were recorded")) for m in found if m.get("gate_passed") is True})
    if others:
        return None, f"not trained in run {runs[0]} (run {', '.join(others)} has one: --reuse-from {others[0]} to use it)"
    return None, "never materialized"


def gate_miss(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str, run: str) -> str | None:
    """The reason of the partition's newest failed validation gate in `run` (a missed gate records its check,
    then fails the step without a materialization), else None."""
    for evaluation in failed_check_evaluations(instance, dg.AssetCheckKey(key, GATE_CHECK), partition):
        recorded = evaluation.metadata.get(ALPHA_RUN)
        if recorded is not None and recorded.value == run:
            reason = evaluation.metadata.get("reason")
            return reason.value if reason is not None else (evaluation.description or "no passing attempt")
    return None


def plan_metadata(context: dg.AssetExecutionContext, symbol: str) -> dict:
    """The fold plans this run made (or a run it reuses made); else the newest of any run, with a warning: a click
    on one checkpoint in the UI must not need its plans again, but a run that plans its own folds uses its own."""
    key = dg.AssetKey("fold_plans")
    plans = run_metadata(context, key, symbol)
    if plans is None:
        plans = latest_metadata(context, key, symbol)
        if plans is None:
            raise dg.Failure(f"fold_plans[{symbol}] has never been materialized")
        context.log.warning(
            f"fold_plans[{symbol}] was not materialized in run {runs_in_scope(context)[0]}: using run "
            f"{plans.get(ALPHA_RUN, 'unknown')}'s (materialize fold_plans in this run to plan its own folds)"
        )
    # counts are text in the metadata (shown, never plotted)
    return {
        **plans,
        "cv_n_folds": int(plans["cv_n_folds"]),
        "train_window": int(plans["train_window"]),
        # plans materialized before the purge and embargo existed had neither
        "purge_sessions": int(plans.get("purge_sessions", 0)),
        "embargo_sessions": int(plans.get("embargo_sessions", 0)),
    }
