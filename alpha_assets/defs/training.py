"""Training lineage, generated from the model registry: hyperopt params -> per-fold checkpoints -> ensemble report.

- `hyperopt/<model>` [symbol]: PSO results.json on the files before the symbol's first test file, with a blocking
  check that every trial completed and that no file it used is a test file.
- `checkpoints/<model>` [symbol x fold]: one walk-forward fold, reading the hyperopt params when that asset has
  been materialized (the original system's precedence). Each attempt (the Dagster run id) is written in its own folder; the
  `validation_gate` check (blocking, `alpha_core.gates`) records the metric, the threshold and the partition. A
  passing attempt is promoted to `models/<model>/<symbol>/fold-<k>` and materialized; a missed gate fails the
  step with its reason in one line (no materialization), so Dagster shows the partition, its run and its
  backfill as failed.
- `ensemble_report` [symbol]: `alpha evaluate` over exactly the attempts recorded by passing materializations;
  every requested model x fold is in it or under Excluded with its reason (never materialized, gate failed, ...).
- `run_summary` (unpartitioned): across symbols, the reports' ensemble metrics and what the steps cost in GPU- and
  CPU-hours and EUR.

Every materialization writes under `{storage}/{run_id}/` in the original system's layout (`hyperopt/<model>/<symbol>/`,
`models/<model>/<symbol>/fold-<k>/`, `eval/<symbol>/`); nothing is overwritten in place.
"""

import math
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from alpha_assets import metadata
from alpha_assets.conditions import REPORT_AUTOMATION, TRAINING_AUTOMATION
from alpha_assets.dagster_private import latest_failed_check_evaluation
from alpha_assets.execution import CPU_POOL, STEP_RETRY_POLICY, placement
from alpha_assets.failures import fail_without_retry
from alpha_assets.metadata import OWNERS, clean
from alpha_assets.partitions import N_FOLDS, split_symbol_fold, symbol_fold_key, symbol_fold_partitions, symbol_partitions
from alpha_assets.resources import DataRoot, StorageRoot, run_id
from alpha_core import artifacts
from alpha_core.eval.report import epoch_curves
from alpha_core.gates import GATE_CHECK, GateThresholds, check_gate, gated_value
from alpha_core.models import registry

HYPEROPT_CHECK = "hyperopt_isolation"
REPORT_CHECK = "report_complete"
GATE_TAG = "alpha/gate"  # `alpha/gate/<model>` on a run whose checkpoint missed its gate: the reason, in the runs list
MODELS = registry.select("all")  # every registry model: the asset graph never depends on the environment


class TrainAssetConfig(dg.Config):
    """Launchpad settings of a checkpoint. A value left unset is the CLI trainer's own default (EPOCHS 50 for the
    ensemble, the flagship's original defaults, ...), so the UI, the scheduled retrain, `alpha run` and the original
    commands train alike; each value is checked by the trainer's own config."""

    epochs: int | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    n_train_seqs: int | None = None
    n_val_seqs: int | None = None
    timesteps_per_epoch: int | None = None  # RL agents
    device: str | None = None
    precision: str | None = None  # fp32 | bf16 (the flagship; bf16 autocast)
    min_val_auc: float = GateThresholds().min_val_auc  # gate: mean validation AUC must be above this
    min_val_sharpe: float = GateThresholds().min_val_sharpe  # RL gate: validation Sharpe must be above this


class HyperoptAssetConfig(dg.Config):
    """Launchpad settings of a search; unset values are `alpha hyperopt`'s defaults (HYPEROPT_TRIALS 20, ...)."""

    trials: int | None = None
    epochs: int | None = None
    workers: int | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    n_train_seqs: int | None = None
    n_val_seqs: int | None = None
    timesteps_per_epoch: int | None = None
    device: str | None = None


class CPUTrainAssetConfig(TrainAssetConfig):
    """A checkpoint of a model placed on CPU pods (`alpha_assets.execution.placement`): the CPU by default."""

    device: str | None = "cpu"


class CPUHyperoptAssetConfig(HyperoptAssetConfig):
    device: str | None = "cpu"


class ReportConfig(dg.Config):
    """The models this report must account for (every registry model by default); `alpha run` sets them."""

    models: list[str] | None = None


def materializations(context: dg.AssetExecutionContext, key: dg.AssetKey, partition: str, limit: int = 1) -> list[dict]:
    """The metadata of the newest materializations of one partition, newest first."""
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=limit, ascending=False
    ).records
    return [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in records]


def latest_metadata(context: dg.AssetExecutionContext, key: dg.AssetKey, partition: str) -> dict | None:
    found = materializations(context, key, partition)
    return found[0] if found else None


def passing_checkpoint(context: dg.AssetExecutionContext, model: str, symbol: str, fold: int) -> tuple[dict | None, str]:
    """The newest checkpoint attempt of a partition that passed its gate, or None and why there is none.

    The one rule the report uses: only attempts whose gate passed (and which were therefore promoted) count, so
    a later gate-failed attempt under the same RUN_ID never changes what a report evaluates.
    """
    key, partition = dg.AssetKey(["checkpoints", model]), symbol_fold_key(symbol, fold)
    found = materializations(context, key, partition, limit=50)
    for meta in found:
        if meta.get("gate_passed") is True:
            return meta, ""
    missed = latest_gate_miss(context.instance, key, partition)
    if missed is not None:
        return None, f"gate failed: {missed}"
    if found:  # a gate-failed attempt materialized by an older version of this asset
        return None, f"gate failed: {found[0].get('gate', 'no passing attempt')}"
    return None, "never materialized"


def latest_gate_miss(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str) -> str | None:
    """The reason of the partition's latest validation gate if it failed (a missed gate records its check, then
    fails the step without a materialization), else None."""
    evaluation = latest_failed_check_evaluation(instance, dg.AssetCheckKey(key, GATE_CHECK), partition)
    if evaluation is None:
        return None
    reason = evaluation.metadata.get("reason")
    return reason.value if reason is not None else (evaluation.description or "no passing attempt")


@contextmanager
def leased_device(place, context: dg.AssetExecutionContext) -> Iterator[None]:
    """A GPU step on a host with several GPUs runs on one of its own (alpha_core.devices); others run as they are."""
    if not place.on_gpu:
        yield
        return
    from alpha_core.devices import gpu_lease

    with gpu_lease(run=context.run.run_id, step=f"{context.asset_key.to_user_string()}[{context.partition_key}]") as gpu:
        if gpu is not None:
            context.log.info(f"leased GPU {gpu} of this host")
        yield


def _plan_metadata(context: dg.AssetExecutionContext, symbol: str) -> dict:
    plans = latest_metadata(context, dg.AssetKey("fold_plans"), symbol)
    if plans is None:
        raise dg.Failure(f"fold_plans[{symbol}] has never been materialized")
    # counts are text in the metadata (shown, never plotted)
    return {**plans, "cv_n_folds": int(plans["cv_n_folds"]), "train_window": int(plans["train_window"])}


def _hyperopt_asset(name: str) -> dg.AssetsDefinition:
    key = dg.AssetKey(["hyperopt", name])
    spec, place = registry.get(name), placement(name)
    config_class = HyperoptAssetConfig if place.on_gpu else CPUHyperoptAssetConfig

    @dg.asset(
        key=key,
        partitions_def=symbol_partitions,
        group_name="hyperopt",
        kinds={"nevergrad"},
        deps=["bar_sidecars", "fold_plans"],
        pool=place.pool,
        op_tags=place.op_tags,
        retry_policy=STEP_RETRY_POLICY,
        automation_condition=TRAINING_AUTOMATION,
        owners=OWNERS,
        metadata=metadata.code_references(
            ("alpha_core.hyperopt.pso", "hyperopt"), ("alpha_core.data.folds", "hyperopt_leakage")
        ),
        description=f"PSO hyperparameter search for {name}, on the files before the symbol's first test file. "
        f"{spec.description}",
        check_specs=[
            dg.AssetCheckSpec(
                HYPEROPT_CHECK,
                asset=key,
                blocking=True,
                partitions_def=symbol_partitions,
                description=(
                    "Every trial completed with a finite score, and no file the search trained or validated on is a "
                    "test file of any fold (alpha_core.data.folds.hyperopt_leakage: the search never sees the data it "
                    "is evaluated on)."
                ),
            )
        ],
    )
    def _asset(
        context: dg.AssetExecutionContext, config: config_class, data: DataRoot, storage: StorageRoot
    ) -> dg.MaterializeResult:
        from alpha_core.data.folds import FoldPlan, hyperopt_leakage
        from alpha_core.hyperopt.pso import HyperoptConfig, hyperopt
        from alpha_core.train.perception import resolve_device

        symbol = context.partition_key
        plans = _plan_metadata(context, symbol)
        out = storage.run_dir(run_id(context)) / "hyperopt" / name / symbol / "results.json"
        started = time.perf_counter()
        with fail_without_retry(), leased_device(place, context):
            results = hyperopt(
                HyperoptConfig(
                    model=name,
                    data_dir=data.symbol_dir(symbol),
                    output=out,
                    predecoded_dir=storage.predecoded_dir(symbol),
                    symbol=symbol,
                    cv_n_folds=plans["cv_n_folds"],
                    cv_train_window=plans["train_window"],
                    **given(config, HyperoptConfig.model_fields),
                ),
                run=context.run.run_id,
                retry=context.retry_number > 0,  # a retry of this step (a lost pod) takes the output's lock over
            )
        scores = [t["score"] for t in results["trials"]]
        problems = [
            f"trial {t['trial']}: score {t['score']} is not finite" for t in results["trials"] if not math.isfinite(t["score"])
        ]
        wanted = results["settings"]["trials"]
        problems += [f"{len(scores)} of {wanted} trials completed"] if len(scores) != wanted else []
        problems += hyperopt_leakage(FoldPlan.model_validate(plans["plans"]["bars"]), results)
        best = metadata.series("best_score", symbol)
        return dg.MaterializeResult(
            metadata=clean(
                {
                    "wall_time_s": metadata.text(time.perf_counter() - started, 1),
                    "device": str(resolve_device(config.device)),
                    "path": dg.MetadataValue.path(str(out)),
                    best: results["best_score"],
                    "best_params": dg.MetadataValue.json(results["best_params"]),
                    "trials": metadata.text(len(scores)),
                    "trial_scores": metadata.table(
                        [{"trial": t["trial"], "score": t["score"], "val_sharpe": t["val_sharpe"]} for t in results["trials"]]
                    ),
                    "train_files": dg.MetadataValue.json(results["train_files"]),
                    "val_files": dg.MetadataValue.json(results["val_files"]),
                    "run_id": context.run.run_id,
                }
            ),
            check_results=[
                dg.AssetCheckResult(
                    check_name=HYPEROPT_CHECK,
                    passed=not problems,
                    description="; ".join(problems[:5]) or "ok",
                    metadata=clean(
                        {
                            "problems": dg.MetadataValue.json(problems[:50]),
                            "trials": metadata.text(len(scores)),
                            best: results["best_score"],
                        }
                    ),
                )
            ],
        )

    return _asset


def _checkpoint_asset(name: str) -> dg.AssetsDefinition:
    spec, place = registry.get(name), placement(name)
    config_class = TrainAssetConfig if place.on_gpu else CPUTrainAssetConfig
    key = dg.AssetKey(["checkpoints", name])
    deps = [dg.AssetDep("fold_plans", partition_mapping=dg.MultiToSingleDimensionPartitionMapping("symbol"))]
    if spec.search_space is not None:
        deps.append(
            dg.AssetDep(dg.AssetKey(["hyperopt", name]), partition_mapping=dg.MultiToSingleDimensionPartitionMapping("symbol"))
        )

    core = {"supervised": ("alpha_core.train.supervised", "train_supervised"), "rl": ("alpha_core.train.rl", "train_rl")}.get(
        spec.trainer, ("alpha_core.train.perception", "PerceptionTrainer")
    )

    @dg.asset(
        key=key,
        partitions_def=symbol_fold_partitions,
        group_name="training",
        deps=deps,
        pool=place.pool,
        op_tags=place.op_tags,
        retry_policy=STEP_RETRY_POLICY,
        automation_condition=TRAINING_AUTOMATION,
        owners=OWNERS,
        kinds={"pytorch", "safetensors"},
        code_version=spec.code_version,
        metadata=metadata.code_references(core, ("alpha_core.gates", "check_gate")),
        description=f"{name}, one walk-forward fold: {spec.description} A partition that misses its "
        "validation gate is Failed (its attempt stays unpromoted); its reason is the run's error.",
        check_specs=[
            dg.AssetCheckSpec(
                GATE_CHECK,
                asset=key,
                blocking=True,
                partitions_def=symbol_fold_partitions,
                description=(
                    "The validation gate (alpha_core.gates.check_gate): mean validation AUC (supervised, book) or "
                    "validation Sharpe (RL) above its minimum. A missed gate fails the step: the partition is Failed, "
                    "the attempt is not promoted, and nothing downstream, now or later, uses it."
                ),
            )
        ],
    )
    def _asset(
        context: dg.AssetExecutionContext, config: config_class, data: DataRoot, storage: StorageRoot
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        symbol, fold = split_symbol_fold(context.partition_key)
        plans = _plan_metadata(context, symbol)
        hyper = latest_metadata(context, dg.AssetKey(["hyperopt", name]), symbol) if spec.search_space else None
        params_file = hyper["path"] if hyper else None
        run_dir = storage.run_dir(run_id(context))
        dest = run_dir / "models" / name / symbol / f"fold-{fold}"
        attempt = artifacts.Attempt(dest, context.run.run_id)  # a retried step continues (or reuses) its attempt
        with fail_without_retry():
            thresholds = GateThresholds(min_val_auc=config.min_val_auc, min_val_sharpe=config.min_val_sharpe)
            retry = context.retry_number > 0  # Dagster retries this step (a lost pod): it takes the attempt over
            summary, horizons = _train(spec, name, symbol, fold, plans, params_file, config, data, storage, attempt, retry)
        value, loss = gated_value(spec.trainer, summary.model_dump())
        gate = check_gate(spec.trainer, value, thresholds, loss)
        if gate.passed:
            artifacts.promote(attempt)
        partition = context.partition_key
        aucs = getattr(summary, "val_auc", None) or getattr(summary, "best_mean_auc_per_horizon", None)
        curves = epoch_curves(summary.epoch_metrics, f"{name} {symbol} fold {fold} (attempt {attempt.id[:8]})")
        meta = clean(
            {
                "gate": gate.reason,
                "gate_passed": gate.passed,
                "path": dg.MetadataValue.path(str(attempt.path)),
                "promoted_to": dg.MetadataValue.path(str(dest)) if gate.passed else None,
                **({"curves": metadata.png(curves, f"{name} {symbol} fold {fold}: per-epoch curves")} if curves else {}),
                "tensorboard": tensorboard(run_dir / "models", name, symbol, fold),
                metadata.series(gate.metric, partition): value,
                metadata.series("final_train_loss", partition): loss,
                **{
                    metadata.series(k, partition): v
                    for k, v in (metadata.per_horizon("val_auc", horizons, aucs) if aucs else {}).items()
                },
                **({"val_auc": dg.MetadataValue.json([metadata.number(a) for a in aucs])} if aucs else {}),
                **({"epoch_metrics": metadata.table(summary.epoch_metrics)} if summary.epoch_metrics else {}),
                "epochs": metadata.text(summary.epochs),
                "wall_time_s": metadata.text(summary.wall_time_s, 1),
                "device": summary.device,
                "attempt": attempt.id,
                "run_id": context.run.run_id,
                **({"params_file": dg.MetadataValue.path(str(params_file))} if params_file else {}),
            }
        )
        check = dg.AssetCheckResult(
            check_name=GATE_CHECK,
            passed=gate.passed,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"{name} {symbol} fold {fold}: {gate.reason}",
            metadata=clean(
                {
                    "metric": gate.metric,
                    "value": metadata.text(gate.value),
                    "threshold": metadata.text(gate.threshold),
                    "reason": gate.reason,
                    metadata.series(gate.metric, partition): value,
                    "partition": partition,
                    "attempt": attempt.id,
                }
            ),
        )
        if gate.passed:
            yield dg.MaterializeResult(metadata=meta, check_results=[check])
            return
        # A missed gate is a failed partition, not a materialization: Dagster then shows the partition Failed,
        # the run Failure with this one line as its error, and the backfill as failed (it counts a partition
        # materialized whenever a materialization was recorded, whatever its checks said). The check is
        # recorded first, so the report lists the fold as "gate failed" with this reason.
        yield check
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


def given(config: dg.Config, fields) -> dict:
    """The settings of `config` that are set and that a trainer's config has (`fields`); the rest keep its default."""
    return {k: v for k, v in config.model_dump().items() if v is not None and k in fields}


def _train(spec, name, symbol, fold, plans, params_file, config, data, storage, attempt, retry):
    """Train one fold as `attempt` (not promoted): its summary and horizons."""
    common = {
        "cv_n_folds": plans["cv_n_folds"],
        "cv_train_window": plans["train_window"],
        "cv_fold": fold,
        "allow_untested_folds": True,
    }  # the fold plan asset already decided, and checked, the layout
    out = attempt.dest.parent
    if spec.trainer == "supervised":
        from alpha_core.train.supervised import SupervisedTrainConfig, train_supervised

        cfg = SupervisedTrainConfig(
            model=name,
            data_dir=data.symbol_dir(symbol),
            output_dir=out,
            symbol=symbol,
            predecoded_dir=storage.predecoded_dir(symbol),
            **common,
            **given(config, SupervisedTrainConfig.model_fields),
        )
        (s,) = train_supervised(cfg, params_file, attempt_id=attempt.id, promote=False, retry=retry)
        return s, s.horizons
    if spec.trainer == "rl":
        from alpha_core.train.rl import RLTrainConfig, train_rl

        cfg = RLTrainConfig(
            model=name,
            data_dir=data.symbol_dir(symbol),
            output_dir=out,
            symbol=symbol,
            predecoded_dir=storage.predecoded_dir(symbol),
            **common,
            **given(config, RLTrainConfig.model_fields),
        )
        (s,) = train_rl(cfg, params_file, attempt_id=attempt.id, promote=False, retry=retry)
        return s, []
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


@dg.asset(
    partitions_def=symbol_partitions,
    group_name="evaluation",
    kinds={"matplotlib"},
    code_version="4",  # 4: validation weights from the checkpoints' recorded scores
    pool=CPU_POOL,
    automation_condition=REPORT_AUTOMATION,
    owners=OWNERS,
    metadata=metadata.code_references(("alpha_core.eval.evaluate", "evaluate"), ("alpha_core.eval.report", "headline")),
    deps=[
        dg.AssetDep(dg.AssetKey(["checkpoints", m]), partition_mapping=dg.MultiToSingleDimensionPartitionMapping("symbol"))
        for m in MODELS
    ],
    description="Out-of-sample backtests of every checkpoint that passed its gate, and the ensembles (alpha evaluate). "
    "`headline`: per model and ensemble, the sessions, Sharpe, 95% CI, DSR, max drawdown and PnL (ticks, "
    "net of cost); `equity`: equity and drawdown by session; `results`: every metric; `excluded`: each "
    "model x fold left out, with its reason; `used`: the checkpoints evaluated; `sharpe` and `dsr`: the "
    "equal-weight ensemble's, one series per symbol.",
    check_specs=[
        dg.AssetCheckSpec(
            REPORT_CHECK,
            asset="ensemble_report",
            blocking=True,
            partitions_def=symbol_partitions,
            description=(
                "Every requested model x fold is in the report or under Excluded with its reason (never materialized, gate "
                "failed, ...), and every row has a DSR."
            ),
        )
    ],
)
def ensemble_report(
    context: dg.AssetExecutionContext, config: ReportConfig, data: DataRoot, storage: StorageRoot
) -> dg.MaterializeResult:
    from alpha_core.eval.evaluate import EvalConfig, evaluate
    from alpha_core.eval.report import Excluded, headline

    symbol = context.partition_key
    models = registry.select(",".join(config.models)) if config.models else MODELS
    out = storage.run_dir(run_id(context)) / "eval" / symbol
    view = out / "models"  # the checkpoints this report uses: recorded by passing materializations, linked
    if view.exists():  # a re-run under the same RUN_ID: the view (links only) is rebuilt from current metadata
        shutil.rmtree(view)
    used, upstream_excluded = [], []
    for model in models:
        for fold in range(N_FOLDS):
            meta, reason = passing_checkpoint(context, model, symbol, fold)
            if meta is None:
                upstream_excluded.append(Excluded(model=model, symbol=symbol, fold=fold, reason=reason))
                continue
            link = view / model / symbol / f"fold-{fold}"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(meta["path"], target_is_directory=True)
            used.append({"model": model, "fold": fold, "attempt": meta["attempt"], "run_id": meta["run_id"]})
    if not used:
        raise dg.Failure(
            f"no checkpoint of {symbol} has passed its gate",
            metadata={"excluded": dg.MetadataValue.json([e.model_dump() for e in upstream_excluded])},
        )
    # gate=None: the view holds promoted attempts only, each gated at promotion by its own run's thresholds; the
    # hyperopt search behind each checkpoint (the DSR's N and V) is the one its summary records, as for the CLI
    report = evaluate(
        EvalConfig(
            models_dir=view,
            data_dir=Path(data.root),
            output=out / "ensemble_report.json",
            symbols=[symbol],
            predecoded_dir=Path(storage.root) / "predecoded",
            upstream_excluded=upstream_excluded,
            gate=None,
        )
    )
    sym = report.symbols[symbol]
    rows = {**sym.models, **{f"ensemble: {k}": v for k, v in sym.ensembles.items()}}
    accounted = {(u["model"], u["fold"]) for u in used} | {(e.model, e.fold) for e in report.excluded}
    missing = [f"{m} fold {f}" for m in models for f in range(N_FOLDS) if (m, f) not in accounted]
    no_dsr = [name for name, r in rows.items() if r.oos.dsr is None]
    problems = [f"not accounted for: {m}" for m in missing] + [f"no DSR: {n}" for n in no_dsr]
    equal = sym.ensembles.get("equal_weight")
    figure = out / f"{symbol}_equity_drawdown.png"
    return dg.MaterializeResult(
        metadata=clean(
            {
                # keys of at most 8 characters: Dagster sizes its key column to the longest, and the headline beside it
                # must fit at 1,600 px
                "headline": dg.MetadataValue.md(headline(sym)),
                "equity": metadata.inline_png(figure, f"{symbol}: out-of-sample equity and drawdown by session")
                if figure.is_file()
                else None,
                metadata.series("sharpe", symbol): equal.oos.sharpe if equal else None,  # the equal-weight ensemble's
                metadata.series("dsr", symbol): equal.oos.dsr if equal else None,
                "results": metadata.table(
                    [
                        {
                            "row": name,
                            "sessions": r.oos.n_sessions,
                            "sharpe": r.oos.sharpe,
                            "sharpe_se": r.oos.sharpe_se,
                            "ci_low": r.oos.sharpe_ci_low,
                            "ci_high": r.oos.sharpe_ci_high,
                            "psr": r.oos.psr,
                            "dsr": r.oos.dsr,
                            "dsr_n": r.oos.dsr_n_trials,
                            "max_drawdown": r.oos.max_drawdown,
                            "turnover": r.oos.turnover,
                            "total_pnl": r.oos.total_pnl,
                        }
                        for name, r in rows.items()
                    ]
                ),
                "excluded": metadata.table([e.model_dump() for e in report.excluded]),
                "used": metadata.table(used),  # the checkpoints this report evaluated
                "by_fold": metadata.inline_png(out / f"{symbol}_fold_sharpe.png", f"{symbol}: Sharpe per fold"),
                "report": dg.MetadataValue.md((out / "ensemble_report.md").read_text()),
                "curves": dg.MetadataValue.md(
                    f"`tensorboard --logdir {view}`: the per-epoch curves of every checkpoint in this report"
                ),
                "path": dg.MetadataValue.path(str(out / "ensemble_report.json")),
                "run_id": context.run.run_id,
            }
        ),
        check_results=[
            dg.AssetCheckResult(
                check_name=REPORT_CHECK,
                passed=not problems,
                description="; ".join(problems[:5]) or "ok",
                metadata={
                    "problems": dg.MetadataValue.json(problems),
                    "excluded": metadata.text(len(report.excluded)),
                    "checkpoints": metadata.text(len(used)),
                },
            )
        ],
    )


# code references (the UI's "Code" links): each asset's own function, after the alpha_core functions it calls
hyperopt_assets = dg.with_source_code_references(
    [_hyperopt_asset(m) for m in MODELS if registry.get(m).search_space is not None]
)
checkpoint_assets = dg.with_source_code_references([_checkpoint_asset(m) for m in MODELS])
(ensemble_report,) = dg.with_source_code_references([ensemble_report])


class CostConfig(dg.Config):
    eur_per_gpu_hour: float = 3.0  # the original system's H100 figure
    eur_per_cpu_hour: float = 0.5  # an assumption: one 16-vCPU node, where the RL steps run (deploy/README.md)


SPEC_COST_TABLE = """| Scenario (original system, H100 ~EUR 3/hr) | Jobs | Time | Cost |
|---|---:|---|---:|
| Single model, single symbol | 3 | ~1 hr | ~EUR 3 |
| Full ensemble, single symbol | 14 | ~1 hr (parallel) | ~EUR 16 |
| Full ensemble, 4 symbols | 56 | ~2 hr (parallel) | ~EUR 65 |"""


@dg.asset(
    group_name="evaluation",
    kinds={"json"},
    deps=[ensemble_report],
    code_version="1",
    owners=OWNERS,
    description="Across symbols: the reports' ensemble metrics and what the steps cost in GPU-, CPU-hours and EUR.",
)
def run_summary(context: dg.AssetExecutionContext, config: CostConfig, storage: StorageRoot) -> dg.MaterializeResult:
    from alpha_core.atomic import atomic_write_json

    steps, symbols = [], {}
    for model in MODELS:
        for key, partitions in (
            (dg.AssetKey(["checkpoints", model]), symbol_fold_partitions.get_partition_keys()),
            (dg.AssetKey(["hyperopt", model]), symbol_partitions.get_partition_keys()),
        ):
            for partition in partitions:
                meta = latest_metadata(context, key, partition)
                if meta and "wall_time_s" in meta:
                    steps.append(
                        {
                            "asset": key.to_user_string(),
                            "partition": partition,
                            "device": meta["device"],
                            "wall_time_s": float(meta["wall_time_s"]),
                        }
                    )
    for symbol in symbol_partitions.get_partition_keys():
        meta = latest_metadata(context, dg.AssetKey("ensemble_report"), symbol)
        if meta:
            sharpe = meta.get(metadata.series("sharpe", symbol), meta.get("ensemble_sharpe"))  # (before: unkeyed)
            symbols[symbol] = {"report": meta["path"], "ensemble_sharpe": sharpe}
    gpu_hours = sum(s["wall_time_s"] for s in steps if s["device"].startswith("cuda")) / 3600
    compute_hours = sum(s["wall_time_s"] for s in steps) / 3600
    cpu_hours = compute_hours - gpu_hours
    summary = {
        "symbols": symbols,
        "steps": len(steps),
        "gpu_hours": gpu_hours,
        "cpu_hours": cpu_hours,
        "compute_hours": compute_hours,
        "eur_per_gpu_hour": config.eur_per_gpu_hour,
        "eur_per_cpu_hour": config.eur_per_cpu_hour,
        "cost_eur": gpu_hours * config.eur_per_gpu_hour + cpu_hours * config.eur_per_cpu_hour,
        "step_costs": steps,
    }
    path = atomic_write_json(storage.run_dir(run_id(context)) / "summary.json", summary)
    table = (
        f"| this run | {len(steps)} | {compute_hours:.2f} h of steps ({gpu_hours:.2f} GPU-h, {cpu_hours:.2f} "
        f"CPU-h) | EUR {summary['cost_eur']:.2f} |"
    )
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(str(path)),
            "gpu_hours": gpu_hours,
            "cpu_hours": cpu_hours,
            "compute_hours": compute_hours,
            "cost_eur": summary["cost_eur"],
            "steps": len(steps),
            "symbols": dg.MetadataValue.json(symbols),
            "cost_table": dg.MetadataValue.md(SPEC_COST_TABLE + "\n" + table),
        }
    )


(run_summary,) = dg.with_source_code_references([run_summary])


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=[*hyperopt_assets, *checkpoint_assets, ensemble_report, run_summary])
