"""Data assets per symbol: book and bar sidecars, and the walk-forward fold plans, with their gates.

They hold slots of the `cpu` pool (dagster.yaml's default limit); fold plans follow new sidecars by themselves
(`FOLD_PLANS_AUTOMATION`), so whatever rebuilds the sidecars also refreshes the folds the training reads.
"""

import dagster as dg
from pydantic import Field

from alpha_assets import metadata
from alpha_assets.conditions import FOLD_PLANS_AUTOMATION
from alpha_assets.execution import CPU_POOL
from alpha_assets.failures import fail_without_retry
from alpha_assets.partitions import N_FOLDS, SYMBOL_DIM, symbol_partitions
from alpha_assets.resources import DataRoot, StorageRoot, run_id
from alpha_core.atomic import atomic_write_json
from alpha_core.bounds import MAX_GAP_SESSIONS
from alpha_core.data.checks import label_tail_problems, sidecar_problems
from alpha_core.data.dbn import MBP10, OHLCV_1M
from alpha_core.data.folds import EMBARGO_SESSIONS, PURGE_SESSIONS, check_leakage, check_schemas_agree, plan_folds
from alpha_core.data.oracle import oracle_auc
from alpha_core.data.predecode import Predecoded, file_ref, predecode
from alpha_core.data.sidecar import FEATURE_VERSION, LabelConfig, load_sidecar

INTEGRITY = "sidecar_integrity"
LEAKAGE = "fold_leakage"


class SidecarConfig(dg.Config):
    """Label settings of the sidecars (empty = the defaults of the original system and the product)."""

    horizons: list[int] | None = None
    outcome_label_cost: float | None = None


class FoldConfig(dg.Config):
    """The walk-forward window in calendar quarters (0: n_quarters - N_FOLDS - 1, the CLI's default) and the purge
    and embargo in sessions (the CLI's defaults, `alpha_core.data.folds`). The number of folds is not configurable
    here: it is the fold partitions' (N_FOLDS), the CLI's default too."""

    cv_train_window: int = Field(0, ge=0)
    purge_sessions: int = Field(PURGE_SESSIONS, ge=0, le=MAX_GAP_SESSIONS)
    embargo_sessions: int = Field(EMBARGO_SESSIONS, ge=0, le=MAX_GAP_SESSIONS)


def sidecar_manifest(items: list[Predecoded]) -> list[dict]:
    """The small record downstream assets read from this asset's metadata."""
    return [
        {
            "sidecar": str(i.sidecar.path),
            "source": i.sidecar.meta.source.name,
            "source_path": i.sidecar.meta.source.path,
            "rows": i.sidecar.rows,
            "first_time": i.sidecar.meta.first_time,
            "last_time": i.sidecar.meta.last_time,
            "status": i.status,
        }
        for i in items
    ]


def _summary_table(items: list[Predecoded]) -> str:
    lines = ["| file | rows | from | to | contracts | rolls | status |", "|---|---:|---|---|---|---|---|"]
    for i in items:
        m = i.sidecar.meta
        rolls = "; ".join(f"{r.session}: {r.from_contract}->{r.to_contract}" for r in m.roll_dates) or "-"
        contracts = ", ".join(f"{k} {v}" for k, v in m.contracts.items())
        lines.append(f"| {m.source.name} | {m.rows} | {m.first_time} | {m.last_time} | {contracts} | {rolls} | {i.status} |")
    return "\n".join(lines)


# a symbol's sidecars read every quarter `raw_dbn` fetched of it (and whatever else is in its folder)
RAW_DBN_DEP = dg.AssetDep("raw_dbn", partition_mapping=dg.MultiToSingleDimensionPartitionMapping(SYMBOL_DIM))


def _sidecar_asset(name: str, schema: str, description: str) -> dg.AssetsDefinition:
    @dg.asset(
        name=name,
        description=description,
        partitions_def=symbol_partitions,
        deps=[RAW_DBN_DEP],
        group_name="data",
        kinds={"databento", "numpy"},
        code_version=FEATURE_VERSION,
        pool=CPU_POOL,
        owners=metadata.OWNERS,
        metadata=metadata.code_references(
            ("alpha_core.data.predecode", "predecode"), ("alpha_core.data.checks", "sidecar_problems")
        ),
        check_specs=[
            dg.AssetCheckSpec(
                INTEGRITY,
                asset=name,
                blocking=True,
                partitions_def=symbol_partitions,
                description=(
                    "Every sidecar of the symbol is sane (alpha_core.data.checks.sidecar_problems): timestamps in order, "
                    "an uncrossed book on its tick grid, finite features, labels NaN only where a horizon leaves the file. "
                    "A failure stops the fold plans and everything that trains on them."
                ),
            )
        ],
    )
    def _asset(
        context: dg.AssetExecutionContext, config: SidecarConfig, data: DataRoot, storage: StorageRoot
    ) -> dg.MaterializeResult:
        symbol = context.partition_key
        with fail_without_retry():
            labels = LabelConfig(
                horizons=tuple(config.horizons) if config.horizons else None,
                outcome_label_cost=config.outcome_label_cost,
            )
            items = predecode(data.symbol_dir(symbol), storage.predecoded_dir(symbol), symbol, schema, labels)
        problems = [p for i in items for p in sidecar_problems(i.sidecar)]
        first = items[0].sidecar.meta
        rolls = [f"{r.session}: {r.from_contract}->{r.to_contract}" for i in items for r in i.sidecar.meta.roll_dates]
        context.log.info(f"{symbol} {schema}: {len(items)} files, statuses {[i.status for i in items]}")
        oracle = oracle_auc([i.sidecar for i in items])  # demo data only: the best achievable AUC
        return dg.MaterializeResult(
            metadata={
                **(
                    {"oracle_auc": dg.MetadataValue.json(dict(zip(map(str, first.horizons), oracle, strict=True)))}
                    if oracle
                    else {}
                ),
                "files": metadata.text(len(items)),
                "rows": metadata.text(sum(i.sidecar.rows for i in items)),
                "built": metadata.text(sum(i.status != "reused" for i in items)),
                "first_time": first.first_time,
                "last_time": items[-1].sidecar.meta.last_time,
                "roll_dates": dg.MetadataValue.json(rolls),
                "feature_names": dg.MetadataValue.json(first.feature_names),
                "horizons": dg.MetadataValue.json({first.horizon_unit: first.horizons}),
                "outcome_label_cost": metadata.text(first.outcome_label_cost),
                "files_table": dg.MetadataValue.md(_summary_table(items)),
                "predecoded_dir": dg.MetadataValue.path(str(storage.predecoded_dir(symbol))),
                "manifest": dg.MetadataValue.json(sidecar_manifest(items)),
            },
            check_results=[
                dg.AssetCheckResult(
                    check_name=INTEGRITY,
                    passed=not problems,
                    metadata={"problems": dg.MetadataValue.json(problems[:50]), "n_problems": metadata.text(len(problems))},
                )
            ],
        )

    return _asset


book_sidecars = _sidecar_asset(
    "book_sidecars", MBP10, "Predecoded MBP-10 sidecars (book features, labels at 10/100/1000 snapshots)."
)
bar_sidecars = _sidecar_asset(
    "bar_sidecars", OHLCV_1M, "Predecoded OHLCV-1m sidecars (bar features, labels at 5/15/60 minutes)."
)
book_sidecars, bar_sidecars = dg.with_source_code_references([book_sidecars, bar_sidecars])


def upstream_manifest(context: dg.AssetExecutionContext, asset: str, partition: str) -> list[dict]:
    """The manifest an upstream asset recorded for `partition` (its latest materialization)."""
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1
    ).records
    if not records:
        raise dg.Failure(f"{asset}[{partition}] has never been materialized")
    materialization = records[0].asset_materialization
    return materialization.metadata["manifest"].value


@dg.asset(
    partitions_def=symbol_partitions,
    group_name="data",
    kinds={"json"},
    deps=[book_sidecars, bar_sidecars],
    code_version="3",  # 3: purge and embargo in sessions; 2: calendar quarters, not files
    pool=CPU_POOL,
    automation_condition=FOLD_PLANS_AUTOMATION,
    owners=metadata.OWNERS,
    metadata=metadata.code_references(("alpha_core.data.folds", "plan_folds"), ("alpha_core.data.folds", "check_leakage")),
    check_specs=[
        dg.AssetCheckSpec(
            LEAKAGE,
            asset="fold_plans",
            blocking=True,
            partitions_def=symbol_partitions,
            description=(
                "No quarter is in two splits of a fold and each fold's train, val and test are strictly ordered in time "
                "(alpha_core.data.folds.check_leakage); no label crosses its file's end (alpha_core.data.checks."
                "label_tail_problems)."
            ),
        )
    ],
    description=(
        "Walk-forward fold plans over calendar quarters (train/val/test quarters, whatever the files' split) for the "
        "book and bar sidecars; gaps are listed, schemas that disagree on a quarter are refused."
    ),
)
def fold_plans(context: dg.AssetExecutionContext, config: FoldConfig, storage: StorageRoot) -> dg.MaterializeResult:
    symbol = context.partition_key
    plans, planned, problems = {}, {}, []
    kinds = (("book", "book_sidecars", MBP10), ("bars", "bar_sidecars", OHLCV_1M))
    sidecars = {
        schema: [load_sidecar(entry["sidecar"]) for entry in upstream_manifest(context, upstream, symbol)]
        for _, upstream, schema in kinds
    }
    refs = {schema: [file_ref(sc) for sc in scs] for schema, scs in sidecars.items()}
    with fail_without_retry():
        check_schemas_agree(refs)  # the bar models and the flagship must be tested on the same quarters
    for kind, _, schema in kinds:
        with fail_without_retry():
            plan = plan_folds(
                refs[schema],
                N_FOLDS,
                config.cv_train_window,
                schema=schema,
                purge_sessions=config.purge_sessions,
                embargo_sessions=config.embargo_sessions,
            )
        planned[schema] = plan
        plans[kind] = plan.model_dump()
        problems += [f"{kind}: {p}" for p in check_leakage(plan)]
        problems += [f"{kind}: {p}" for sc in sidecars[schema] for p in label_tail_problems(sc)]
    gaps = [g for plan in planned.values() for g in plan.gaps]
    for gap in gaps:
        context.log.warning(f"{symbol}: {gap}")
    path = atomic_write_json(storage.run_dir(run_id(context)) / "folds" / symbol / "fold_plans.json", plans)
    table = ["| kind | fold | train | val | test |", "|---|---:|---|---|---|"]
    for kind, plan in plans.items():
        for f in plan["folds"]:

            def names(refs, cut):
                return (", ".join(r["name"] for r in refs) or "-") + (f" (not {', '.join(cut)})" if cut else "")

            table.append(
                f"| {kind} | {f['fold']} | {names(f['train'], f['purged'])} | {names(f['val'], f['val_embargoed'])} "
                f"| {names(f['test'], f['test_embargoed'])} |"
            )
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(str(path)),
            "alpha_run": run_id(context),
            "run_id": context.run.run_id,
            "cv_n_folds": metadata.text(N_FOLDS),  # read by the training steps
            "train_window": metadata.text(plans["book"]["window"]),
            "purge_sessions": metadata.text(config.purge_sessions),  # read by the training steps and the report
            "embargo_sessions": metadata.text(config.embargo_sessions),
            "folds_table": dg.MetadataValue.md("\n".join(table)),
            "quarters": dg.MetadataValue.json(planned[MBP10].units),
            "gaps": dg.MetadataValue.json(gaps),
            "plans": dg.MetadataValue.json(plans),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name=LEAKAGE,
                passed=not problems,
                metadata={"problems": dg.MetadataValue.json(problems[:50]), "n_problems": metadata.text(len(problems))},
            )
        ],
    )


(fold_plans,) = dg.with_source_code_references([fold_plans])


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=[book_sidecars, bar_sidecars, fold_plans])
