"""`alpha` command line: the same functions the Dagster assets call, usable without Dagster."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from alpha_core.errors import DataError, PlanError


def _iso(ts_ns: int | None) -> str | None:
    return None if ts_ns is None else dt.datetime.fromtimestamp(ts_ns / 1e9, tz=dt.UTC).isoformat()


def _given(args: argparse.Namespace, *skip: str) -> dict:
    """The options the user set (argparse defaults of None mean: let the config's default apply)."""
    return {k: v for k, v in vars(args).items() if v is not None and k not in ("func", "command", *skip)}


def _symbols(value: str | None) -> list[str] | None:
    return None if not value else [s.strip() for s in value.split(",") if s.strip()]


# --- inspect ---------------------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    from alpha_core.data.dbn import iter_records, read_info

    rows, failed = [], 0
    for path in args.paths:
        try:
            info = read_info(path)
            count, first, last = 0, None, None
            for chunk in iter_records(info):
                if len(chunk):
                    first = int(chunk["ts_event"][0]) if first is None else first
                    last = int(chunk["ts_event"][-1])
                    count += len(chunk)
        except DataError as exc:
            print(f"alpha inspect: {exc}", file=sys.stderr)
            failed += 1
            continue
        rows.append(
            {
                "path": str(path),
                "schema": info.schema,
                "dataset": info.dataset,
                "dbn_version": info.version,
                "stype_in": info.stype_in,
                "symbols": list(info.symbols),
                "records": count,
                "first_ts": _iso(first),
                "last_ts": _iso(last),
                "metadata_start": _iso(info.start),
                "metadata_end": _iso(info.end),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(
                f"{r['path']}\n  schema={r['schema']} dataset={r['dataset']} dbn=v{r['dbn_version']} "
                f"stype_in={r['stype_in']} symbols={','.join(r['symbols'])}\n"
                f"  records={r['records']} first={r['first_ts']} last={r['last_ts']}"
            )
    return 1 if failed else 0


# --- predecode -------------------------------------------------------------------------------------


def cmd_predecode(args: argparse.Namespace) -> int:
    from alpha_core.data.checks import sidecar_problems
    from alpha_core.data.predecode import predecode, symbol_dir
    from alpha_core.data.products import PRODUCTS

    data_dir, out_dir = Path(args.data_dir), Path(args.predecoded_dir)
    symbols = _symbols(args.symbols)
    if symbols is None:  # a data root with one folder per symbol, or a folder of one product's files
        symbols = sorted(p.name for p in data_dir.glob("*") if p.name in PRODUCTS and p.is_dir())
        jobs = [(symbol_dir(data_dir, s), s) for s in symbols] or [(data_dir, None)]
    else:
        jobs = [((data_dir / s) if (data_dir / s).is_dir() else data_dir, s) for s in symbols]
    problems = []
    for directory, symbol in jobs:
        out = out_dir / symbol if symbol else out_dir
        for item in predecode(directory, out, symbol=symbol):
            m = item.sidecar.meta
            print(f"{item.status:8s} {m.symbol:7s} {m.kind:4s} {m.source.name}: {m.rows} rows -> {item.sidecar.path}")
            problems += sidecar_problems(item.sidecar)
    for p in problems:
        print(f"alpha predecode: integrity: {p}", file=sys.stderr)
    return 1 if problems else 0


# --- folds -----------------------------------------------------------------------------------------


def cmd_folds(args: argparse.Namespace) -> int:
    from alpha_core.data.dbn import SUPPORTED_SCHEMAS, discover
    from alpha_core.data.folds import FileRef, plan_folds

    files = discover(args.data_dir, args.schema)
    plans = {}
    for schema in SUPPORTED_SCHEMAS:
        refs = [
            FileRef(path=str(f.path), name=f.name, start=f.start, end=(f.end - 1) if f.end else f.start)
            for f in files
            if f.schema == schema
        ]
        if refs:
            plans[schema] = plan_folds(refs, args.cv_n_folds, args.cv_train_window)
    if args.json:
        print(json.dumps({s: p.model_dump() for s, p in plans.items()}, indent=2))
        return 0
    for schema, plan in plans.items():
        print(f"{schema}: {plan.n_files} files, {plan.cv_n_folds} fold(s), train window {plan.window}")
        for fold in plan.folds:
            def names(refs):
                return ", ".join(r.name for r in refs) or "-"
            print(f"  fold {fold.fold}: train [{names(fold.train)}]  val [{names(fold.val)}]  test [{names(fold.test)}]")
    return 0


# --- demo-data -------------------------------------------------------------------------------------


def cmd_demo_data(args: argparse.Namespace) -> int:
    from alpha_core.data.demo import generate_demo_data
    from alpha_core.data.products import PRODUCTS

    symbols = _symbols(args.symbols) or list(PRODUCTS)
    paths = generate_demo_data(Path(args.out), args.scale, args.seed, symbols, args.quarters)
    print(f"wrote {len(paths)} DBN files ({args.scale}, seed {args.seed}) under {args.out}")
    for p in paths:
        print(f"  {p}")
    return 0


# --- train (the flagship perception trainer) ------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    from alpha_core.train.perception import TrainConfig, train

    values = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    summary = train(TrainConfig(**values))
    print(f"wrote {Path(args.out) / 'alpha_train_summary.json'}: best mean AUC {summary.best_mean_auc:.4f} "
          f"(epoch {summary.best_mean_auc_epoch}), {summary.sequences_per_s:.0f} sequences/s on {summary.device}")
    return 0


def add_train_parser(sub) -> None:
    """Every flag of the spec's `alpha_train` with its name and default, plus --device/--resume/--precision."""
    p = sub.add_parser("train", help="train the Mamba2 -> CfC -> heads perception model on MBP-10 sidecars")
    p.add_argument("--mbp10-data-dir", required=True, type=Path, help="directory containing MBP-10 .dbn.zst files")
    p.add_argument("--predecoded-dir", required=True, type=Path, help="predecoded sidecar caches (created on miss)")
    p.add_argument("--out", required=True, type=Path, help="output directory for weights + summary JSON")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=64, help="snapshots per training sequence")
    p.add_argument("--mamba2-state-dim", type=int, default=16)
    p.add_argument("--lr-cfc", type=float, default=3e-3)
    p.add_argument("--lr-mamba2", type=float, default=1e-3)
    p.add_argument("--lr-aux", type=float, default=None, help="aux AdamW group (default: --lr-cfc)")
    p.add_argument("--n-train-seqs", type=int, default=8000)
    p.add_argument("--n-val-seqs", type=int, default=1000)
    p.add_argument("--seed", type=lambda v: int(v, 0), default=0x4242)
    p.add_argument("--lr-warmup-steps", type=int, default=200, help="linear warm-up steps; 0 disables")
    p.add_argument("--lr-min-factor", type=float, default=0.1, help="final LR = lr * this; 1.0 disables decay")
    p.add_argument("--early-stop-patience", type=int, default=5, help="epochs without improvement; 0 disables")
    p.add_argument("--early-stop-metric", default="mean_auc", help="val_loss | mean_auc | auc_h1000 | none")
    p.add_argument("--horizon-weights", default=None, help="per-horizon BCE weights, e.g. 1.0,1.0,0.5")
    p.add_argument("--auto-horizon-weights", action="store_true", help="the canonical schedule (uniform)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--cv-fold", type=int, default=0)
    p.add_argument("--cv-n-folds", type=int, default=1)
    p.add_argument("--cv-train-window", type=int, default=0)
    p.add_argument("--smoothness-base-lambda", type=float, default=0.0)
    p.add_argument("--kernel-step-trace", type=Path, default=None, help="write one JSON line per step here")
    p.add_argument("--bucket-warmup-cap-steps", type=int, default=None)
    p.add_argument("--outcome-label-cost", type=float, default=None,
                   help="round-trip cost in price units (default: 2 ticks; 0.5 for ES)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
    p.add_argument("--resume", action="store_true", help="continue from the training state in --out")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--cuda-graph", action="store_true", help="capture the whole training step in one CUDA graph")
    p.add_argument("--compile", action="store_true", help="torch.compile forward + loss (GPU; slow first step)")
    p.add_argument("--no-fused-scan", dest="fused_scan", action="store_false",
                   help="on cuda, run the CfC recurrence in torch instead of the fused Triton kernel")
    p.set_defaults(func=cmd_train)


# --- the model zoo ---------------------------------------------------------------------------------


def cmd_models(args: argparse.Namespace) -> int:
    from alpha_core.models.registry import REGISTRY

    rows = [
        {"name": s.name, "group": s.group, "input": s.input, "trainer": s.trainer, "description": s.description,
         "hyperopt": None if s.search_space is None else {k: v.model_dump(exclude_none=True)
                                                           for k, v in s.search_space.items()}}
        for s in REGISTRY.values()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        space = ", ".join(r["hyperopt"]) if r["hyperopt"] else "none"
        print(f"{r['name']:11s} {r['group']:10s} {r['input']:5s} hyperopt: {space}\n            {r['description']}")
    return 0


def _explicit_params(pairs: list[str] | None) -> dict:
    """`--param KEY=VALUE` (VALUE parsed as JSON when it can be: 32, 1e-3, true, [1,2])."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PlanError(f"--param expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def cmd_train_supervised(args: argparse.Namespace) -> int:
    from alpha_core.train.params import TRAIN_KEYS
    from alpha_core.train.supervised import SupervisedTrainConfig, train_supervised

    values = _given(args, "params_file", "param")
    explicit = {k: values.pop(k) for k in TRAIN_KEYS if k in values}
    explicit.update(_explicit_params(args.param))
    summaries = train_supervised(SupervisedTrainConfig(**values), args.params_file, explicit)
    for s in summaries:
        print(f"fold {s.fold}: {s.checkpoint_metric} checkpoint from epoch {s.checkpoint_epoch}, "
              f"val AUC {' '.join(f'{a:.3f}' for a in s.val_auc)} -> {Path(args.output_dir) / f'fold-{s.fold}'}")
    return 0


def add_train_supervised_parser(sub) -> None:
    p = sub.add_parser("train-supervised", help="walk-forward training of a supervised registry model")
    p.add_argument("--model", required=True, help="a supervised model of `alpha models`")
    p.add_argument("--data-dir", required=True, type=Path, help="one symbol's DBN folder")
    p.add_argument("--output-dir", required=True, type=Path, help="fold-<k>/ folders are written here")
    p.add_argument("--params-file", type=Path, help="JSON params or a hyperopt results.json (missing = defaults)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="explicit model/training parameter (wins)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--cv-fold", type=int, help="train this fold only (default: every fold)")
    p.add_argument("--cv-n-folds", type=int)
    p.add_argument("--cv-train-window", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--n-train-seqs", type=int)
    p.add_argument("--n-val-seqs", type=int)
    p.add_argument("--early-stop-patience", type=int)
    p.add_argument("--early-stop-metric", help="val_loss | mean_auc | auc_h1000 | none")
    p.add_argument("--predecoded-dir", type=Path)
    p.add_argument("--symbol", help="product to extract when a file maps several (e.g. ES.FUT)")
    p.add_argument("--seed", type=lambda v: int(v, 0))
    p.add_argument("--device")
    p.set_defaults(func=cmd_train_supervised)


def cmd_train_rl(args: argparse.Namespace) -> int:
    from alpha_core.train.rl import RLTrainConfig, train_rl

    values = _given(args, "params_file", "param")
    for s in train_rl(RLTrainConfig(**values), args.params_file, _explicit_params(args.param)):
        print(f"fold {s.fold}: best validation Sharpe {s.val_sharpe:.3f} (epoch {s.best_epoch}), "
              f"turnover {s.val_turnover:.3f} -> {Path(args.output_dir) / f'fold-{s.fold}'}")
    return 0


def add_train_rl_parser(sub) -> None:
    p = sub.add_parser("train-rl", help="walk-forward training of the DQN / PPO members")
    p.add_argument("--model", required=True, choices=["dqn", "ppo"])
    p.add_argument("--data-dir", required=True, type=Path, help="one symbol's DBN folder (OHLCV-1m files are used)")
    p.add_argument("--output-dir", required=True, type=Path)
    p.add_argument("--params-file", type=Path, help="JSON params or a hyperopt results.json (missing = defaults)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="explicit agent parameter (wins)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--timesteps-per-epoch", type=int)
    p.add_argument("--early-stop-patience", type=int)
    p.add_argument("--cv-fold", type=int)
    p.add_argument("--cv-n-folds", type=int)
    p.add_argument("--cv-train-window", type=int)
    p.add_argument("--window", type=int)
    p.add_argument("--episode-len", type=int)
    p.add_argument("--n-envs", type=int)
    p.add_argument("--cost-per-turnover", type=float, help="ticks per unit of position change")
    p.add_argument("--predecoded-dir", type=Path)
    p.add_argument("--symbol")
    p.add_argument("--seed", type=lambda v: int(v, 0))
    p.add_argument("--device")
    p.set_defaults(func=cmd_train_rl)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from alpha_core.eval.evaluate import EvalConfig, evaluate

    values = _given(args)
    if "symbols" in values:
        values["symbols"] = _symbols(values["symbols"])
    report = evaluate(EvalConfig(**values))
    print(Path(args.output).with_suffix(".md").read_text())
    for e in report.excluded:
        print(f"excluded: {e.model} {e.symbol} fold {e.fold}: {e.reason}", file=sys.stderr)
    return 0


def add_evaluate_parser(sub) -> None:
    p = sub.add_parser("evaluate", help="out-of-sample backtests of every checkpoint and the ensemble report")
    p.add_argument("--models-dir", required=True, type=Path, help="models/<model>/<symbol>/fold-<k>/ checkpoints")
    p.add_argument("--data-dir", required=True, type=Path, help="data root with one folder per symbol")
    p.add_argument("--output", required=True, type=Path, help="ensemble_report.json (.md and PNGs beside it)")
    p.add_argument("--symbols", help="comma-separated (default: every symbol with checkpoints)")
    p.add_argument("--horizon", type=int, help="horizon index the positions follow (default 0, the shortest)")
    p.add_argument("--band", type=float, help="flat while |P(up) - 0.5| <= band (default 0.05)")
    p.add_argument("--cost-ticks", type=float, help="cost per unit of position change in ticks (default 1)")
    p.add_argument("--predecoded-dir", type=Path)
    p.add_argument("--device")
    p.set_defaults(func=cmd_evaluate)


def cmd_run(args: argparse.Namespace) -> int:
    """The spec's CI trigger as one Dagster asset backfill; the one command that needs Dagster (alpha_assets.run)."""
    from alpha_assets import run

    plan = run.plan(_symbols(args.symbols) or [], args.models, args.phase, args.epochs, args.hyperopt_trials,
                    args.run_id or run.default_run_id(), args.max_parallel,
                    run.parse_json_option("--train-config", args.train_config),
                    run.parse_json_option("--hyperopt-config", args.hyperopt_config))
    print(f"RUN_ID {plan.run_id}: one backfill of {plan.size} asset partitions ({plan.phase}) for "
          f"{','.join(plan.symbols)}, models {','.join(plan.models)}, at most {plan.max_parallel} GPU steps at once",
          flush=True)
    if args.dry_run:
        print(run.describe(plan))
        return 0
    ok = run.launch_remote(plan, args.remote) if args.remote else run.launch_local(plan)
    return 0 if ok else 1


def add_run_parser(sub) -> None:
    import os

    env = os.environ.get
    p = sub.add_parser("run", help="the CI trigger: SYMBOLS/MODELS/PHASE/... as one Dagster backfill (local or --remote)")
    p.add_argument("--symbols", default=env("SYMBOLS", "ES.FUT"), help="comma-separated (env SYMBOLS)")
    p.add_argument("--models", default=env("MODELS", "all"), help="all | rl | supervised | a,b (env MODELS)")
    p.add_argument("--phase", default=env("PHASE", "full"), help="hyperopt | train | eval | full (env PHASE)")
    # argparse converts string defaults with `type`, so a bad environment value is a clean usage error
    p.add_argument("--max-parallel", type=int, default=env("MAX_PARALLEL", "10"),
                   help="GPU steps at once across the instance: the `gpu` pool limit (env MAX_PARALLEL)")
    p.add_argument("--epochs", type=int, default=env("EPOCHS", "50"), help="per walk-forward fold (env EPOCHS)")
    p.add_argument("--hyperopt-trials", type=int, default=env("HYPEROPT_TRIALS", "20"),
                   help="PSO trials per model (env HYPEROPT_TRIALS)")
    p.add_argument("--run-id", default=env("RUN_ID") or None, help="default: YYYYMMDD-HHMMSS (env RUN_ID)")
    p.add_argument("--remote", help="a running Dagster webserver, e.g. http://dagster-webserver:80")
    p.add_argument("--train-config", help="JSON merged into every checkpoint's config (e.g. batch size)")
    p.add_argument("--hyperopt-config", help="JSON merged into every hyperopt config")
    p.add_argument("--dry-run", action="store_true", help="print the backfill only")
    p.set_defaults(func=cmd_run)


def cmd_hyperopt(args: argparse.Namespace) -> int:
    from alpha_core.hyperopt.pso import HyperoptConfig, hyperopt

    values = _given(args)
    results = hyperopt(HyperoptConfig(**values))
    print(f"best validation mean AUC {results['best_score']:.4f} with {results['best_params']} -> {args.output}")
    return 0


def add_hyperopt_parser(sub) -> None:
    p = sub.add_parser("hyperopt", help="particle swarm search over a registry model's hyperparameters")
    p.add_argument("--model", required=True)
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--output", required=True, type=Path, help="results.json (loadable as --params-file)")
    p.add_argument("--trials", type=int, help="PSO trials (default 20, the spec's HYPEROPT_TRIALS)")
    p.add_argument("--epochs", type=int, help="epochs per trial (default 3)")
    p.add_argument("--timesteps-per-epoch", type=int, help="RL trials: environment steps per epoch (default 5000)")
    p.add_argument("--workers", type=int, help="particles evaluated concurrently per generation (default 1)")
    p.add_argument("--seed", type=lambda v: int(v, 0))
    p.add_argument("--cv-n-folds", type=int)
    p.add_argument("--cv-train-window", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--n-train-seqs", type=int)
    p.add_argument("--n-val-seqs", type=int)
    p.add_argument("--predecoded-dir", type=Path)
    p.add_argument("--symbol")
    p.add_argument("--device")
    p.set_defaults(func=cmd_hyperopt)


# --- entry point -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="alpha", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="show schema, dataset, version, symbols, counts and time range of DBN files")
    p.add_argument("paths", nargs="+", type=Path)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("predecode", help="build or reuse the predecoded sidecars of every DBN file")
    p.add_argument("--data-dir", required=True, help="data root ({SYMBOL}/... folders) or one symbol's folder")
    p.add_argument("--predecoded-dir", required=True, help="sidecar cache directory (created on miss)")
    p.add_argument("--symbols", help="comma-separated, e.g. ES.FUT,NQ.FUT (default: every symbol folder)")
    p.set_defaults(func=cmd_predecode)

    p = sub.add_parser("folds", help="print the walk-forward fold plan of a folder of DBN files")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--cv-n-folds", type=int, default=1)
    p.add_argument("--cv-train-window", type=int, default=0)
    p.add_argument("--schema", choices=["mbp-10", "ohlcv-1m"], help="only this schema (default: each found)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_folds)

    p = sub.add_parser("demo-data", help="write synthetic DBN files with a planted, learnable signal")
    p.add_argument("--out", required=True)
    p.add_argument("--scale", choices=["tiny", "small", "full"], default="small")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--symbols", help="comma-separated (default: ES.FUT,NQ.FUT,ZN.FUT,6E.FUT)")
    p.add_argument("--quarters", type=int, help="quarterly files per symbol (default: the scale's)")
    p.set_defaults(func=cmd_demo_data)

    add_train_parser(sub)
    add_train_supervised_parser(sub)
    add_train_rl_parser(sub)
    add_hyperopt_parser(sub)
    add_evaluate_parser(sub)
    add_run_parser(sub)

    p = sub.add_parser("models", help="list the model registry (name, group, input, hyperopt space)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (DataError, PlanError) as exc:
        print(f"alpha {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
