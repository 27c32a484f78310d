"""`hyperopt/<model>` [symbol]: the PSO search of each model with a search space, on the files before the symbol's
first test file, with a blocking check that every trial completed and that no file it used is a test file."""

import math
import time

import dagster as dg

from alpha_assets import metadata
from alpha_assets.asset_configs import CPUHyperoptAssetConfig, HyperoptAssetConfig, given
from alpha_assets.checked import checked_asset
from alpha_assets.conditions import TRAINING_AUTOMATION
from alpha_assets.execution import STEP_RETRY_POLICY, leased_device, placement
from alpha_assets.failures import fail_without_retry
from alpha_assets.metadata import clean
from alpha_assets.partitions import symbol_partitions
from alpha_assets.records import ALPHA_RUN, plan_metadata
from alpha_assets.resources import DataRoot, StorageRoot, run_id
from alpha_core.models import registry

HYPEROPT_CHECK = "hyperopt_isolation"
MODELS = registry.select("all")  # every registry model: the asset graph never depends on the environment


def _hyperopt_asset(name: str) -> dg.AssetsDefinition:
    key = dg.AssetKey(["hyperopt", name])
    spec, place = registry.get(name), placement(name)
    config_class = HyperoptAssetConfig if place.on_gpu else CPUHyperoptAssetConfig

    @checked_asset(
        key,
        symbol_partitions,
        HYPEROPT_CHECK,
        (
            "Every trial completed with a finite score, and no file the search trained or validated on is a "
            "test file of any fold (alpha_core.data.folds.hyperopt_leakage: the search never sees the data it "
            "is evaluated on)."
        ),
        group_name="hyperopt",
        kinds={"nevergrad"},
        deps=["bar_sidecars", "fold_plans"],
        pool=place.pool,
        op_tags=place.op_tags,
        retry_policy=STEP_RETRY_POLICY,
        automation_condition=TRAINING_AUTOMATION,
        metadata=metadata.code_references(
            ("alpha_core.hyperopt.pso", "hyperopt"), ("alpha_core.data.folds", "hyperopt_leakage")
        ),
        description=f"PSO hyperparameter search for {name}, on the files before the symbol's first test file. "
        f"{spec.description}",
    )
    def _asset(
        context: dg.AssetExecutionContext, config: config_class, data: DataRoot, storage: StorageRoot
    ) -> dg.MaterializeResult:
        from alpha_core.data.folds import FoldPlan, hyperopt_leakage
        from alpha_core.devices import resolve_device
        from alpha_core.hyperopt.pso import HyperoptConfig, hyperopt

        symbol = context.partition_key
        plans = plan_metadata(context, symbol)
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
                    purge_sessions=plans["purge_sessions"],
                    embargo_sessions=plans["embargo_sessions"],
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
        best = metadata.series("best_score", symbol, run_id(context))
        return dg.MaterializeResult(
            metadata=clean(
                {
                    "wall_time_s": metadata.text(time.perf_counter() - started, 1),
                    "device": str(resolve_device(config.device)),
                    "path": dg.MetadataValue.path(str(out)),
                    best: results["best_score"],
                    "best_params": dg.MetadataValue.json(results["best_params"]),
                    "trials": metadata.text(len(scores)),
                    # every trial's params and score, named: what the search tried and what each try gave
                    "trials_table": metadata.table(
                        [
                            {
                                "trial": t["trial"],
                                results["metric"].split(" (")[0]: t["score"],
                                "val_sharpe": t["val_sharpe"],
                                **{f"param {k}": v for k, v in t.get("params", {}).items()},
                            }
                            for t in results["trials"]
                        ]
                    ),
                    "train_files": dg.MetadataValue.json(results["train_files"]),
                    "val_files": dg.MetadataValue.json(results["val_files"]),
                    ALPHA_RUN: run_id(context),
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


hyperopt_assets = dg.with_source_code_references(
    [_hyperopt_asset(m) for m in MODELS if registry.get(m).search_space is not None]
)


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=hyperopt_assets)
