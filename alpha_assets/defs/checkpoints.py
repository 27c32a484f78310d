"""`checkpoints/<model>` [symbol x fold]: one walk-forward fold of every registry model, reading its run's hyperopt
params when that asset has been materialized (the original system's precedence). Each attempt (the Dagster run id) is
written in its own folder; the blocking `validation_gate` check (`alpha_core.gates`) records the metric, the
threshold and the partition. A passing attempt is promoted to `models/<model>/<symbol>/fold-<k>` and materialized; a
missed gate fails the step with its reason in one line (no materialization), so Dagster shows the partition, its run
and its backfill as failed."""

import importlib
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from alpha_assets import metadata
from alpha_assets.asset_configs import CPUTrainAssetConfig, TrainAssetConfig, given
from alpha_assets.checked import checked_asset
from alpha_assets.conditions import TRAINING_AUTOMATION
from alpha_assets.execution import STEP_RETRY_POLICY, placement
from alpha_assets.failures import fail_without_retry
from alpha_assets.metadata import clean
from alpha_assets.partitions import split_symbol_fold, symbol_fold_partitions
from alpha_assets.records import ALPHA_RUN, plan_metadata, run_metadata
from alpha_assets.resources import DataRoot, StorageRoot, run_id
from alpha_core import artifacts
from alpha_core.eval.report import epoch_curves
from alpha_core.gates import GATE_CHECK, GateThresholds, check_gate
from alpha_core.models import registry

GATE_TAG = "alpha/gate"  # `alpha/gate/<model>` on a run whose checkpoint missed its gate: the reason, in the runs list
MODELS = registry.select("all")  # every registry model: the asset graph never depends on the environment


def _checkpoint_asset(name: str) -> dg.AssetsDefinition:
    spec, place = registry.get(name), placement(name)
    config_class = TrainAssetConfig if place.on_gpu else CPUTrainAssetConfig
    key = dg.AssetKey(["checkpoints", name])
    deps = [dg.AssetDep("fold_plans", partition_mapping=dg.MultiToSingleDimensionPartitionMapping("symbol"))]
    if spec.search_space is not None:
        deps.append(
            dg.AssetDep(dg.AssetKey(["hyperopt", name]), partition_mapping=dg.MultiToSingleDimensionPartitionMapping("symbol"))
        )

    core = spec.kind.entry

    @checked_asset(
        key,
        symbol_fold_partitions,
        GATE_CHECK,
        (
            "The validation gate (alpha_core.gates.check_gate): mean validation AUC (supervised, book) or "
            "validation Sharpe (RL) above its minimum. A missed gate fails the step: the partition is Failed, "
            "the attempt is not promoted, and nothing downstream, now or later, uses it."
        ),
        group_name="training",
        deps=deps,
        pool=place.pool,
        op_tags=place.op_tags,
        retry_policy=STEP_RETRY_POLICY,
        automation_condition=TRAINING_AUTOMATION,
        kinds={"pytorch", "safetensors"},
        code_version=spec.code_version,
        metadata=metadata.code_references(core, ("alpha_core.gates", "check_gate")),
        description=f"{name}, one walk-forward fold: {spec.description} A partition that misses its "
        "validation gate is Failed (its attempt stays unpromoted); its reason is the run's error.",
    )
    def _asset(
        context: dg.AssetExecutionContext, config: config_class, data: DataRoot, storage: StorageRoot
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        symbol, fold = split_symbol_fold(context.partition_key)
        plans = plan_metadata(context, symbol)
        hyper = run_metadata(context, dg.AssetKey(["hyperopt", name]), symbol) if spec.search_space else None
        params_file = hyper["path"] if hyper else None
        if spec.search_space and hyper is None:
            context.log.warning(
                f"no hyperopt/{name} [{symbol}] in run {run_id(context)} or the runs it reuses: training on the "
                "defaults (--reuse-from RUN to take another run's search)"
            )
        run_dir = storage.run_dir(run_id(context))
        dest = run_dir / "models" / name / symbol / f"fold-{fold}"
        attempt = artifacts.Attempt(dest, context.run.run_id)  # a retried step continues (or reuses) its attempt
        with fail_without_retry():
            thresholds = GateThresholds(min_val_auc=config.min_val_auc, min_val_sharpe=config.min_val_sharpe)
            retry = context.retry_number > 0  # Dagster retries this step (a lost pod): it takes the attempt over
            summary, horizons = _train(spec, name, symbol, fold, plans, params_file, config, data, storage, attempt, retry)
        recorded = summary.model_dump()
        value, loss = spec.kind.gated_value(recorded)
        gate = check_gate(spec.kind, value, thresholds, loss)
        if gate.passed:
            artifacts.promote(attempt)
        partition = context.partition_key
        aucs = spec.kind.val_aucs(recorded)
        curves = epoch_curves(summary.epoch_metrics, f"{name} {symbol} fold {fold} (attempt {attempt.id[:8]})")
        meta = clean(
            {
                ALPHA_RUN: run_id(context),  # first on the partition's page: whose checkpoint this is
                "gate": gate.reason,
                "gate_passed": gate.passed,
                "path": dg.MetadataValue.path(str(attempt.path)),
                "promoted_to": dg.MetadataValue.path(str(dest)) if gate.passed else None,
                **({"curves": metadata.png(curves, f"{name} {symbol} fold {fold}: per-epoch curves")} if curves else {}),
                "tensorboard": tensorboard(run_dir / "models", name, symbol, fold),
                metadata.series(gate.metric, partition, run_id(context)): value,
                metadata.series("final_train_loss", partition, run_id(context)): loss,
                **{
                    metadata.series(k, partition, run_id(context)): v
                    for k, v in (metadata.per_horizon("val_auc", horizons, aucs) if aucs else {}).items()
                },
                **({"val_auc": dg.MetadataValue.json([metadata.number(a) for a in aucs])} if aucs else {}),
                **({"epoch_metrics": metadata.table(summary.epoch_metrics)} if summary.epoch_metrics else {}),
                "epochs": metadata.text(summary.epochs),
                "wall_time_s": metadata.text(summary.wall_time_s, 1),
                "device": summary.device,
                "attempt": attempt.id,
                "run_id": context.run.run_id,
                "plans_run": plans.get(ALPHA_RUN),  # whose fold plans it trained on: its own run's, unless it had none
                **({"params_file": dg.MetadataValue.path(str(params_file))} if params_file else {}),
            }
        )
        check = dg.AssetCheckResult(
            check_name=GATE_CHECK,
            passed=gate.passed,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"{name} {symbol} fold {fold}: {gate.reason} (run {run_id(context)})",
            metadata=clean(
                {
                    "metric": gate.metric,
                    "value": metadata.text(gate.value),
                    "threshold": metadata.text(gate.threshold),
                    "reason": gate.reason,
                    metadata.series(gate.metric, partition, run_id(context)): value,
                    "partition": partition,
                    "attempt": attempt.id,
                    ALPHA_RUN: run_id(context),
                }
            ),
        )
        if gate.passed:
            yield dg.MaterializeResult(metadata=meta, check_results=[check])
            return
        # A missed gate is a failed partition, not a materialization: Dagster then shows the partition Failed,
        # the run Failure with this one line as its error, and the backfill as failed (it counts a partition
        # materialized whenever a materialization was recorded, whatever its checks said). The check is
        # recorded first, so the report lists the fold as "gate failed" with this reason. It targets no
        # materialization: a yielded result would target the partition's newest one, of whichever run made it,
        # and show another run's checkpoint as failed.
        yield dg.AssetCheckEvaluation(
            asset_key=context.asset_key,
            check_name=GATE_CHECK,
            passed=False,
            metadata=check.metadata,
            severity=check.severity,
            description=check.description,
            blocking=True,
            partition=partition,
        )
        label = "Sharpe" if gate.metric == "val_sharpe" else "AUC"  # short: the runs list shows ~45 characters
        compared = f"{gate.value:.4g} {'>' if gate.value > gate.threshold else '<='} {gate.threshold:g}"
        context.instance.add_run_tags(
            context.run.run_id,
            {
                f"{GATE_TAG}/{name}": f"missed: {label} {compared}"
                + (", not finite" if gate.reason.endswith("not finite") else "")
            },
        )
        raise dg.Failure(
            description=f"{name} {symbol} fold {fold} not promoted: {GATE_CHECK} missed, {gate.reason}",
            metadata={k: v for k, v in meta.items() if k not in ("gate_passed", "promoted_to")},
            allow_retries=False,
        )

    return _asset


def tensorboard(models_dir: Path, name: str, symbol: str, fold: int) -> dg.MetadataValue:
    """How to see this fold's per-epoch scalars in TensorBoard: every attempt of the run writes an event file, so
    one `--logdir` compares models and folds; the link filters the runs to this fold."""
    return dg.MetadataValue.md(
        f"`tensorboard --logdir {models_dir}`, then "
        f"[{name}/{symbol}/fold-{fold}](http://localhost:6006/?runFilter={name}/{symbol}/.fold-{fold}#timeseries)"
    )


def _train(spec, name, symbol, fold, plans, params_file, config, data, storage, attempt, retry):
    """Train one fold as `attempt` (not promoted): its summary and horizons."""
    common = {
        "cv_n_folds": plans["cv_n_folds"],
        "cv_train_window": plans["train_window"],
        "purge_sessions": plans["purge_sessions"],
        "embargo_sessions": plans["embargo_sessions"],
        "cv_fold": fold,
        "allow_untested_folds": True,
    }  # the fold plan asset already decided, and checked, the layout
    out = attempt.dest.parent
    if not spec.kind.reads_book:  # the bar trainers: one settings shape and one entry point signature
        from alpha_core.train import configs

        config_class = getattr(configs, spec.kind.config)
        module, function = spec.kind.entry
        cfg = config_class(
            model=name,
            data_dir=data.symbol_dir(symbol),
            output_dir=out,
            symbol=symbol,
            predecoded_dir=storage.predecoded_dir(symbol),
            **common,
            **given(config, config_class.model_fields),
        )
        train = getattr(importlib.import_module(module), function)
        (s,) = train(cfg, params_file, attempt_id=attempt.id, promote=False, retry=retry)
        return s, [] if spec.kind.trades_actions else s.horizons
    from alpha_core.train.perception import PerceptionTrainer, TrainConfig

    cfg = TrainConfig(
        mbp10_data_dir=data.symbol_dir(symbol) / "mbp-10",
        predecoded_dir=storage.predecoded_dir(symbol),
        out=out,
        **common,
        **given(config, TrainConfig.model_fields),
    )
    s = PerceptionTrainer(cfg, attempt_id=attempt.id, retry=retry).fit(promote=False)
    return s, s.horizons


checkpoint_assets = dg.with_source_code_references([_checkpoint_asset(m) for m in MODELS])


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=checkpoint_assets)
