"""What a run ends with:

- `ensemble_report` [symbol]: `alpha evaluate` over exactly the attempts recorded by the run's passing
  materializations; every requested model x fold is in it or under Excluded with its reason (never materialized,
  gate failed, not trained in this run, ...).
- `run_summary` (unpartitioned): across symbols, the reports' ensemble metrics and what the steps cost in GPU- and
  CPU-hours and EUR.
- `run_comparison` (unpartitioned): two or more runs side by side (`alpha compare`).

Every materialization writes under `{storage}/{run_id}/` in the original system's layout (`eval/<symbol>/`).
"""

import shutil
from pathlib import Path

import dagster as dg

from alpha_assets import metadata
from alpha_assets.asset_configs import ComparisonConfig, CostConfig, ReportConfig
from alpha_assets.checked import checked_asset
from alpha_assets.conditions import REPORT_AUTOMATION
from alpha_assets.execution import CPU_POOL
from alpha_assets.metadata import OWNERS, clean
from alpha_assets.partitions import N_FOLDS, symbol_fold_partitions, symbol_partitions
from alpha_assets.records import ALPHA_RUN, latest_metadata, passing_checkpoint, plan_metadata
from alpha_assets.resources import DataRoot, StorageRoot, run_id
from alpha_core.models import registry

REPORT_CHECK = "report_complete"
# the report's plotted series, the equal-weight ensemble's (`plotted` says so on the page); keys stay short: Dagster
# sizes its key column to the longest, and the headline beside it must fit at 1,600 px
EW_SHARPE, EW_DSR = "sharpe", "dsr"
MODELS = registry.select("all")  # every registry model: the asset graph never depends on the environment


def _equity_in_place(equal, rows: dict) -> dg.MetadataValue | None:
    """The equal-weight ensemble's equity and drawdown (else the first row's), small enough to show without a click."""
    name, row = ("equal_weight", equal) if equal else next(iter(rows.items()), (None, None))
    return metadata.sparkline(row.equity, name) if row else None


@checked_asset(
    "ensemble_report",
    symbol_partitions,
    REPORT_CHECK,
    (
        "Every requested model x fold is in the report or under Excluded with its reason (never materialized, gate "
        "failed, ...), and every row has a DSR."
    ),
    group_name="evaluation",
    kinds={"matplotlib"},
    code_version="5",  # 5: validation and test quarters scored without the fold plan's embargo sessions
    pool=CPU_POOL,
    automation_condition=REPORT_AUTOMATION,
    metadata=metadata.code_references(("alpha_core.eval.evaluate", "evaluate"), ("alpha_core.eval.report", "headline")),
    deps=[
        dg.AssetDep(dg.AssetKey(["checkpoints", m]), partition_mapping=dg.MultiToSingleDimensionPartitionMapping("symbol"))
        for m in MODELS
    ],
    description="Out-of-sample backtests of every checkpoint that passed its gate, and the ensembles (alpha evaluate). "
    "`headline`: per model and ensemble, the sessions, Sharpe, 95% CI, DSR, max drawdown and PnL (ticks, "
    "net of cost); `equity`: the equal-weight ensemble's equity and drawdown in place; `plot`: every row's, by "
    "session; `results`: every metric; `excluded`: each "
    "model x fold left out, with its reason; `used`: the checkpoints evaluated; `sharpe` and `dsr`: the "
    "equal-weight ensemble's, one series per symbol.",
)
def ensemble_report(
    context: dg.AssetExecutionContext, config: ReportConfig, data: DataRoot, storage: StorageRoot
) -> dg.MaterializeResult:
    from alpha_core.eval.evaluate import EvalConfig, evaluate
    from alpha_core.eval.report import Excluded, excluded_in_brief, headline, verdict

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
            used.append(
                {"model": model, "fold": fold, "run": meta[ALPHA_RUN], "attempt": meta["attempt"], "run_id": meta["run_id"]}
            )
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
            embargo_sessions=plan_metadata(context, symbol)["embargo_sessions"],  # the folds' plan, as they trained
            upstream_excluded=upstream_excluded,
            gate=None,
            run_id=run_id(context),
            reused={
                f"{u['model']} fold {u['fold']}": f"run {u['run']} (attempt {u['attempt']})"
                for u in used
                if u["run"] != run_id(context)
            },
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
                "run": run_id(context),
                "verdict": verdict(sym),
                "left out": excluded_in_brief([e for e in report.excluded if e.symbol == symbol]),  # the table: below
                "headline": dg.MetadataValue.md(headline(sym)),
                "equity": _equity_in_place(equal, rows),  # every row's in `plot`, one click away
                "plot": metadata.inline_png(figure, f"{symbol}: out-of-sample equity and drawdown by session")
                if figure.is_file()
                else None,
                # plotted across materializations: the equal-weight ensemble's, named so on the page
                "plotted": f"sharpe [{symbol}], dsr [{symbol}]: the equal-weight ensemble's, one point per report",
                metadata.series(EW_SHARPE, symbol): equal.oos.sharpe if equal else None,
                metadata.series(EW_DSR, symbol): equal.oos.dsr if equal else None,
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


(ensemble_report,) = dg.with_source_code_references([ensemble_report])


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
            sharpe = meta.get(metadata.series(EW_SHARPE, symbol), meta.get("ensemble_sharpe"))  # (before: unkeyed)
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


@dg.asset(
    group_name="evaluation",
    kinds={"markdown"},
    code_version="1",
    owners=OWNERS,
    metadata=metadata.code_references(("alpha_core.eval.compare", "compare")),
    description="Two or more runs' reports side by side (`alpha compare`): each row's Sharpe and DSR per run, each "
    "run's verdict, and every setting, param, data file and code version that differs. Materialize it with the runs "
    "in its config.",
)
def run_comparison(context: dg.AssetExecutionContext, config: ComparisonConfig, storage: StorageRoot) -> dg.MaterializeResult:
    from alpha_core.errors import DataError
    from alpha_core.eval.compare import compare

    if len(config.runs) < 2:
        raise dg.Failure("runs: name two or more RUN_IDs to compare", allow_retries=False)
    try:
        text = compare(config.runs, Path(storage.root))
    except DataError as exc:
        raise dg.Failure(str(exc), allow_retries=False) from None
    return dg.MaterializeResult(metadata={"runs": ", ".join(config.runs), "comparison": dg.MetadataValue.md(f"```\n{text}```")})


(run_comparison,) = dg.with_source_code_references([run_comparison])


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=[ensemble_report, run_summary, run_comparison])
