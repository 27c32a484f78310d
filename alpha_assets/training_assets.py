"""Training lineage, generated from the model registry: hyperopt params -> per-fold checkpoints -> ensemble report.

- `hyperopt/<model>` [symbol]: PSO results.json for every model with a search space.
- `checkpoints/<model>` [symbol x fold]: one walk-forward fold, reading the hyperopt params when that asset has
  been materialized (the spec's precedence). A checkpoint that misses its gate raises `dg.Failure`: it is then
  not materialized, so no later run (a backfill runs each partition in its own run) can pick it up.
- `ensemble_report` [symbol]: `alpha evaluate` over the checkpoints found in upstream materialization metadata.

Every materialization writes under `{storage}/{run_id}/` in the spec's layout (`hyperopt/<model>/<symbol>/`,
`models/<model>/<symbol>/fold-<k>/`, `eval/<symbol>/`); nothing is overwritten in place.
"""

import math
import shutil
import time
from pathlib import Path

import dagster as dg

from alpha_assets.execution import GPU_STEP_TAGS
from alpha_assets.partitions import N_FOLDS, split_symbol_fold, symbol_fold_key, symbol_fold_partitions, symbol_partitions
from alpha_assets.resources import DataRoot, StorageRoot, run_id
from alpha_core.models import registry

GATE = "validation_gate"
MODELS = registry.select("all")  # every registry model: the asset graph never depends on the environment


class TrainAssetConfig(dg.Config):
    """Launchpad settings of a checkpoint (defaults sized for CPU demos; raise them on GPU pods)."""

    epochs: int = 2
    seq_len: int = 32
    batch_size: int = 64
    n_train_seqs: int = 2000
    n_val_seqs: int = 1000
    timesteps_per_epoch: int = 2000
    device: str | None = None
    precision: str = "fp32"  # fp32 | bf16 (the flagship; bf16 autocast)
    gpu_fast_path: bool = True  # the flagship on cuda: torch.compile + the whole step in one CUDA graph
    min_val_auc: float = 0.5  # supervised gate: mean validation AUC of the kept checkpoint
    min_val_sharpe: float = -1e9  # RL gate: validation Sharpe of the kept policy


class HyperoptAssetConfig(dg.Config):
    trials: int = 4
    epochs: int = 1
    workers: int = 1
    seq_len: int = 32
    batch_size: int = 64
    n_train_seqs: int = 1000
    n_val_seqs: int = 500
    timesteps_per_epoch: int = 1000
    device: str | None = None


def latest_metadata(context: dg.AssetExecutionContext, key: dg.AssetKey, partition: str) -> dict | None:
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
    ).records
    return None if not records else {k: v.value for k, v in records[0].asset_materialization.metadata.items()}


def _hyperopt_asset(name: str) -> dg.AssetsDefinition:
    key = dg.AssetKey(["hyperopt", name])

    @dg.asset(key=key, partitions_def=symbol_partitions, group_name="hyperopt", kinds={"nevergrad"},
              deps=["bar_sidecars"], pool="gpu", op_tags=GPU_STEP_TAGS,
              description=f"PSO hyperparameter search for {name}")
    def _asset(context: dg.AssetExecutionContext, config: HyperoptAssetConfig, data: DataRoot,
               storage: StorageRoot) -> dg.MaterializeResult:
        from alpha_core.hyperopt.pso import HyperoptConfig, hyperopt
        from alpha_core.train.perception import resolve_device

        symbol = context.partition_key
        out = storage.run_dir(run_id(context)) / "hyperopt" / name / symbol / "results.json"
        started = time.perf_counter()
        results = hyperopt(HyperoptConfig(
            model=name, data_dir=data.symbol_dir(symbol), output=out, predecoded_dir=storage.predecoded_dir(symbol),
            symbol=symbol, **config.model_dump()))
        return dg.MaterializeResult(metadata={
            "wall_time_s": time.perf_counter() - started, "device": str(resolve_device(config.device)),
            "path": dg.MetadataValue.path(str(out)), "best_score": results["best_score"],
            "best_params": dg.MetadataValue.json(results["best_params"]), "trials": len(results["trials"]),
            "run_id": context.run.run_id,
        })

    return _asset


def _checkpoint_asset(name: str) -> dg.AssetsDefinition:
    spec = registry.get(name)
    key = dg.AssetKey(["checkpoints", name])
    deps = [dg.AssetDep("fold_plans", partition_mapping=dg.MultiToSingleDimensionPartitionMapping("symbol"))]
    if spec.search_space is not None:
        deps.append(dg.AssetDep(dg.AssetKey(["hyperopt", name]),
                                partition_mapping=dg.MultiToSingleDimensionPartitionMapping("symbol")))

    @dg.asset(key=key, partitions_def=symbol_fold_partitions, group_name="training", deps=deps, pool="gpu",
              op_tags=GPU_STEP_TAGS,
              kinds={"pytorch", "safetensors"}, code_version=spec.code_version, description=f"{name}: one walk-forward fold",
              check_specs=[dg.AssetCheckSpec(GATE, asset=key, blocking=True)])
    def _asset(context: dg.AssetExecutionContext, config: TrainAssetConfig, data: DataRoot,
               storage: StorageRoot) -> dg.MaterializeResult:
        symbol, fold = split_symbol_fold(context.partition_key)
        plans = latest_metadata(context, dg.AssetKey("fold_plans"), symbol)
        if plans is None:
            raise dg.Failure(f"fold_plans[{symbol}] has never been materialized")
        hyper = latest_metadata(context, dg.AssetKey(["hyperopt", name]), symbol) if spec.search_space else None
        params_file = hyper["path"] if hyper else None
        out = storage.run_dir(run_id(context)) / "models" / name / symbol
        metrics = _train(spec, name, symbol, fold, plans, params_file, config, data, storage, out)
        passed, reason = _gate(spec, metrics, config)
        metadata = {**metrics, "path": dg.MetadataValue.path(str(out / f"fold-{fold}")), "run_id": context.run.run_id,
                    "params_file": str(params_file), "gate": reason}
        if not passed:  # a hard gate: fail the step so nothing downstream, in this run or a later one, uses it
            raise dg.Failure(description=f"{name} {symbol} fold {fold} missed its gate: {reason}", metadata=metadata)
        return dg.MaterializeResult(metadata=metadata, check_results=[
            dg.AssetCheckResult(check_name=GATE, passed=True, metadata={"gate": reason})])

    return _asset


def _train(spec, name, symbol, fold, plans, params_file, config, data, storage, out) -> dict:
    common = {"cv_n_folds": plans["cv_n_folds"], "cv_train_window": plans["train_window"], "cv_fold": fold}
    if spec.trainer == "supervised":
        from alpha_core.train.supervised import SupervisedTrainConfig, train_supervised

        (s,) = train_supervised(SupervisedTrainConfig(
            model=name, data_dir=data.symbol_dir(symbol), output_dir=out, predecoded_dir=storage.predecoded_dir(symbol),
            symbol=symbol, epochs=config.epochs, seq_len=config.seq_len, batch_size=config.batch_size,
            n_train_seqs=config.n_train_seqs, n_val_seqs=config.n_val_seqs, device=config.device, **common), params_file)
        return {"val_auc": dg.MetadataValue.json(s.val_auc), "mean_val_auc": sum(s.val_auc) / len(s.val_auc),
                "final_train_loss": s.final_train_loss, "epochs": s.epochs, "wall_time_s": s.wall_time_s, "device": s.device}
    if spec.trainer == "rl":
        from alpha_core.train.rl import RLTrainConfig, train_rl

        (s,) = train_rl(RLTrainConfig(
            model=name, data_dir=data.symbol_dir(symbol), output_dir=out, predecoded_dir=storage.predecoded_dir(symbol),
            symbol=symbol, epochs=config.epochs, timesteps_per_epoch=config.timesteps_per_epoch, device=config.device,
            **common), params_file)
        return {"val_sharpe": s.val_sharpe, "val_turnover": s.val_turnover, "epochs": s.epochs,
                "wall_time_s": s.wall_time_s, "device": s.device}
    from alpha_core.train.perception import PerceptionTrainer, TrainConfig, resolve_device

    fast = config.gpu_fast_path and resolve_device(config.device).type == "cuda"
    s = PerceptionTrainer(TrainConfig(
        mbp10_data_dir=data.symbol_dir(symbol) / "mbp-10", predecoded_dir=storage.predecoded_dir(symbol),
        out=out / f"fold-{fold}", epochs=config.epochs, seq_len=config.seq_len, batch_size=config.batch_size,
        n_train_seqs=config.n_train_seqs, n_val_seqs=config.n_val_seqs, device=config.device,
        precision=config.precision, cuda_graph=fast, compile=fast, **common)).fit()
    return {"val_auc": dg.MetadataValue.json(s.best_mean_auc_per_horizon), "mean_val_auc": s.best_mean_auc,
            "final_train_loss": s.final_train_loss, "epochs": s.epochs, "wall_time_s": s.wall_time_s, "device": s.device}


def _gate(spec, metrics: dict, config: TrainAssetConfig) -> tuple[bool, str]:
    if spec.trainer == "rl":
        value = metrics["val_sharpe"]
        ok = math.isfinite(value) and value >= config.min_val_sharpe
        return ok, f"validation Sharpe {value:.3f} (minimum {config.min_val_sharpe})"
    value, loss = metrics["mean_val_auc"], metrics["final_train_loss"]
    ok = math.isfinite(loss) and math.isfinite(value) and value >= config.min_val_auc
    return ok, f"mean validation AUC {value:.3f} (minimum {config.min_val_auc}), train loss {loss:.4f}"


@dg.asset(
    partitions_def=symbol_partitions, group_name="evaluation", kinds={"matplotlib"}, code_version="1",
    deps=[dg.AssetDep(dg.AssetKey(["checkpoints", m]), partition_mapping=dg.MultiToSingleDimensionPartitionMapping("symbol"))
          for m in MODELS],
    description="Out-of-sample backtests of every gated checkpoint and the ensembles (alpha evaluate).",
)
def ensemble_report(context: dg.AssetExecutionContext, data: DataRoot, storage: StorageRoot) -> dg.MaterializeResult:
    from alpha_core.eval.evaluate import EvalConfig, evaluate

    symbol = context.partition_key
    out = storage.run_dir(run_id(context)) / "eval" / symbol
    view = out / "models"  # the checkpoints this report uses: found from metadata, linked, never guessed
    if view.exists():  # a re-run under the same RUN_ID: the view (links only) is rebuilt from current metadata
        shutil.rmtree(view)
    used = []
    for model in MODELS:
        for fold in range(N_FOLDS):
            meta = latest_metadata(context, dg.AssetKey(["checkpoints", model]), symbol_fold_key(symbol, fold))
            if meta is None:
                continue
            link = view / model / symbol / f"fold-{fold}"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(meta["path"], target_is_directory=True)
            used.append(f"{model}/fold-{fold} ({meta['run_id']})")
    if not used:
        raise dg.Failure(f"no gated checkpoint of {symbol} has been materialized")
    report = evaluate(EvalConfig(models_dir=view, data_dir=Path(data.root), output=out / "ensemble_report.json",
                                 symbols=[symbol], predecoded_dir=Path(storage.root) / "predecoded"))
    sym = report.symbols[symbol]
    return dg.MaterializeResult(metadata={
        "path": dg.MetadataValue.path(str(out / "ensemble_report.json")),
        "report": dg.MetadataValue.md((out / "ensemble_report.md").read_text()),
        "equity_plot": dg.MetadataValue.path(str(out / f"{symbol}_equity.png")),
        "checkpoints": dg.MetadataValue.json(used),
        "excluded": dg.MetadataValue.json([e.model_dump() for e in report.excluded]),
        "ensemble_sharpe": sym.ensembles["equal_weight"].oos["sharpe"] if sym.ensembles else None,
        "run_id": context.run.run_id,
    })


hyperopt_assets = [_hyperopt_asset(m) for m in MODELS if registry.get(m).search_space is not None]
checkpoint_assets = [_checkpoint_asset(m) for m in MODELS]


class CostConfig(dg.Config):
    eur_per_gpu_hour: float = 3.0  # the spec's H100 figure


SPEC_COST_TABLE = """| Scenario (spec, H100 ~EUR 3/hr) | Jobs | Time | Cost |
|---|---:|---|---:|
| Single model, single symbol | 3 | ~1 hr | ~EUR 3 |
| Full ensemble, single symbol | 14 | ~1 hr (parallel) | ~EUR 16 |
| Full ensemble, 4 symbols | 56 | ~2 hr (parallel) | ~EUR 65 |"""


@dg.asset(group_name="evaluation", kinds={"json"}, deps=[ensemble_report], code_version="1",
          description="Across symbols: the reports' ensemble metrics and what the steps cost in GPU-hours and EUR.")
def run_summary(context: dg.AssetExecutionContext, config: CostConfig, storage: StorageRoot) -> dg.MaterializeResult:
    from alpha_core.atomic import atomic_write_json

    steps, symbols = [], {}
    for model in MODELS:
        for key, partitions in ((dg.AssetKey(["checkpoints", model]), symbol_fold_partitions.get_partition_keys()),
                                (dg.AssetKey(["hyperopt", model]), symbol_partitions.get_partition_keys())):
            for partition in partitions:
                meta = latest_metadata(context, key, partition)
                if meta and "wall_time_s" in meta:
                    steps.append({"asset": key.to_user_string(), "partition": partition, "device": meta["device"],
                                  "wall_time_s": meta["wall_time_s"]})
    for symbol in symbol_partitions.get_partition_keys():
        meta = latest_metadata(context, dg.AssetKey("ensemble_report"), symbol)
        if meta:
            symbols[symbol] = {"report": meta["path"], "ensemble_sharpe": meta.get("ensemble_sharpe")}
    gpu_hours = sum(s["wall_time_s"] for s in steps if s["device"].startswith("cuda")) / 3600
    compute_hours = sum(s["wall_time_s"] for s in steps) / 3600
    summary = {"symbols": symbols, "steps": len(steps), "gpu_hours": gpu_hours, "compute_hours": compute_hours,
               "eur_per_gpu_hour": config.eur_per_gpu_hour, "cost_eur": gpu_hours * config.eur_per_gpu_hour,
               "step_costs": steps}
    path = atomic_write_json(storage.run_dir(run_id(context)) / "summary.json", summary)
    table = (f"| this run | {len(steps)} | {compute_hours:.2f} h of steps ({gpu_hours:.2f} GPU-h) | "
             f"EUR {summary['cost_eur']:.2f} |")
    return dg.MaterializeResult(metadata={
        "path": dg.MetadataValue.path(str(path)), "gpu_hours": gpu_hours, "compute_hours": compute_hours,
        "cost_eur": summary["cost_eur"], "steps": len(steps), "symbols": dg.MetadataValue.json(symbols),
        "cost_table": dg.MetadataValue.md(SPEC_COST_TABLE + "\n" + table),
    })
