"""The 8 supervised members and the ensembles at the `realistic` difficulty and the `real` scale, through the `alpha`
CLI as a user runs it (issue 31 "Goals"): the fixed rule beside the policy fitted on validation, per member.

    # on the device (carry .whl from bench/prepare_gpu_carry.sh), one call of at most 10 minutes:
    source bench/device_setup.sh && python3 bench/bench_realistic_ensemble.py --device cuda \
        --out $OUT/realistic.json --stop-after 480
    # CPU smoke run (tiny data, 1 epoch, small sizes: ~2-3 minutes on the 2-core VM)
    PYTHONPATH=. .venv/bin/python bench/bench_realistic_ensemble.py --device cpu --scale tiny --epochs 1 \
        --parallel 2 --set n_train_seqs=256 --set n_val_seqs=128 --out bench/out/realistic_smoke.json

Steps, each a `python -m alpha_core.cli` process (no console script or `make` needed, only PYTHONPATH):
1. `alpha demo-data --scale S --difficulty D --book-sessions 0` (bars only; the flag exists at `real` only) for one
   symbol, then `alpha predecode` (kept and reused when the work dir already has the same data); with `perception`
   (the flagship) in `--models`, the book too (at `real`: 3 sessions around each roll), trained by `alpha train`;
2. `alpha train-supervised --model M --cv-fold K` for each member and walk-forward fold, every flag at its default
   but the data/output dirs and `--device` (and `--epochs`/`--set` for a smoke run), `--parallel` at once (the
   flagship's folds one at a time), each with its share of the cores (ALPHA_CPUS_PER_STEP, alpha_core/cpus.py) and
   its own log;
3. `alpha evaluate` at the default 1 tick, once with `--policy fitted` (the default) and once with `--policy fixed`
   (the old rule: horizon 0, band 0.05, one bar), both at once; each report row's `sharpe_by_cost` gives 0 and 1 tick.
`--out` is written after every step, so a call cut short keeps what it measured. `--stop-after S` starts no training
job S seconds after the bench began and kills one still running at S + `--grace`; the evaluations still run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MEMBERS = ("tft", "mamba2", "tggn", "tlob", "liquid", "kan", "xlstm", "diffusion")
FLAGSHIP = "perception"  # in --models: the book is generated too (3 sessions around each roll at `real`), `alpha train`
POLICIES = ("fixed", "fitted")
GOAL_MEMBERS = 5  # issue 31: at least 5 of the 8 members (and the ensemble) positive at 1 tick, fitted policy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="training and evaluation device (cpu | cuda | cuda:N)")
    p.add_argument("--out", type=Path, default=REPO / "bench/out/realistic_ensemble.json")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/realistic-ensemble"), help="data, models, reports, logs")
    p.add_argument("--scale", default="real")
    p.add_argument("--difficulty", default="realistic")
    p.add_argument("--seed", type=int, default=7, help="the generator's seed")
    p.add_argument("--symbol", default="ES.FUT")
    p.add_argument("--models", default=",".join(MEMBERS))
    p.add_argument("--folds", default="0,1,2")
    p.add_argument("--parallel", type=int, default=4, help="training jobs at once (default 4)")
    p.add_argument("--epochs", type=int, help="train-supervised --epochs (default: its own, 50 + early stopping)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another train-supervised flag, e.g. n_train_seqs=256 -> --n-train-seqs 256 (no longer the defaults)",
    )
    p.add_argument("--stop-after", type=float, help="start no training job after this many seconds")
    p.add_argument("--grace", type=float, default=30.0, help="kill a training job still running at stop-after + this")
    p.add_argument("--table", type=Path, metavar="JSON", help="print the table of a written --out JSON and exit")
    a = p.parse_args(argv)
    if a.parallel < 1:
        p.error("--parallel must be >= 1")
    return a


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "alpha_core.cli", "--quiet", *args]


def child_env(cpus: int, work: Path) -> dict[str, str]:
    """This checkout importable (no console script on the device), each process its share of the cores, and one
    compile cache for every job (their kernels compile once)."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in paths and "." not in paths:
        paths.append(str(REPO))
    env |= {"PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1", "ALPHA_CPUS_PER_STEP": str(cpus)}
    env |= dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"), str(cpus))
    env.setdefault("ALPHA_COMPILE_CACHE", str(work / "compile-cache"))
    return env


def start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as sink:
        sink.write(" ".join(cmd) + "\n")
        sink.flush()
        return subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def tail(log: Path, n: int = 3) -> str:
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-n:]) if log.exists() else ""


def run_step(name: str, cmd: list[str], logs: Path, env: dict[str, str]) -> dict:
    began = time.perf_counter()
    rc = start(cmd, logs / f"{name}.log", env).wait()
    r = {"rc": rc, "wall_s": round(time.perf_counter() - began, 2), "log": str(logs / f"{name}.log")}
    print(f"{name}: {r['wall_s']:.1f} s, rc {rc}", flush=True)
    if rc:
        raise SystemExit(f"{name} failed: {tail(logs / f'{name}.log')}")
    return r


def write(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1, default=str))
    tmp.replace(path)


def prepare_data(a: argparse.Namespace, work: Path, env: dict[str, str], out: dict) -> None:
    """Generate and predecode, unless the work dir holds this very data already (the stamp)."""
    stamp = {"scale": a.scale, "difficulty": a.difficulty, "seed": a.seed, "symbol": a.symbol, "book": FLAGSHIP in a.models}
    stamp_file = work / "data.stamp.json"
    if stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        out["steps"]["data"] = {"reused": str(work / "data")}
        return
    shutil.rmtree(work / "data", ignore_errors=True)
    shutil.rmtree(work / "pd", ignore_errors=True)
    gen = ["demo-data", "--out", str(work / "data"), "--scale", a.scale, "--difficulty", a.difficulty]
    bars_only = a.scale == "real" and FLAGSHIP not in a.models.split(",")
    gen += ["--seed", str(a.seed), "--symbols", a.symbol] + (["--book-sessions", "0"] if bars_only else [])
    out["steps"]["demo_data"] = run_step("demo-data", cli(*gen), work / "logs", env)
    pre = ["predecode", "--data-dir", str(work / "data"), "--output-dir", str(work / "pd"), "--symbols", a.symbol]
    out["steps"]["predecode"] = run_step("predecode", cli(*pre), work / "logs", env)
    stamp_file.write_text(json.dumps(stamp))


def train_all(a: argparse.Namespace, work: Path, out: dict, began: float) -> None:
    """Every (member, fold), `--parallel` at once, model by model (a cut-short run keeps whole members)."""
    cpus = max(1, len(os.sched_getaffinity(0)) // a.parallel)
    env = child_env(cpus, work)
    extra = ["--epochs", str(a.epochs)] if a.epochs else []
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        extra += [f"--{key.replace('_', '-')}", value]
    pending = [(m, int(k)) for m in a.models.split(",") for k in a.folds.split(",")]

    def limit(model: str, running: dict) -> int:
        """Jobs that may run at once: the flagship's folds run alone, so each fold's time is its own (a B=1 step is
        latency-bound, and processes sharing a GPU take turns in its time slices)."""
        return 1 if model == FLAGSHIP or any(m == FLAGSHIP for m, _ in running) else a.parallel

    running: dict[tuple[str, int], tuple[subprocess.Popen, float]] = {}
    jobs = out["train"]
    while pending or running:
        elapsed = time.perf_counter() - began
        while pending and len(running) < limit(pending[0][0], running) and not (a.stop_after and elapsed > a.stop_after):
            m, k = pending.pop(0)
            command = ["train"] if m == FLAGSHIP else ["train-supervised", "--model", m]
            cmd = cli(
                *command, "--cv-fold", str(k), "--data-dir", str(work / "data" / a.symbol),
                "--output-dir", str(work / "models" / m / a.symbol), "--predecoded-dir", str(work / "pd"),
                "--device", a.device, *extra,
            )  # fmt: skip
            running[(m, k)] = (start(cmd, work / "logs" / f"train-{m}-{k}.log", env), time.perf_counter())
            jobs[f"{m}/{k}"] = {"status": "running", "cpus": cpus, "log": str(work / "logs" / f"train-{m}-{k}.log")}
            print(f"train {m} fold {k} ({elapsed:.0f} s)", flush=True)
        if a.stop_after and elapsed > a.stop_after:
            for m, k in pending:
                jobs[f"{m}/{k}"] = {"status": f"not started: --stop-after {a.stop_after:g} s"}
            pending = []
        for (m, k), (proc, t0) in list(running.items()):
            if proc.poll() is None and a.stop_after and elapsed > a.stop_after + a.grace:
                proc.kill()
                proc.wait()
                jobs[f"{m}/{k}"]["killed"] = f"still running at --stop-after + --grace ({elapsed:.0f} s)"
            if proc.poll() is None:
                continue
            del running[(m, k)]
            job = jobs[f"{m}/{k}"] | {"rc": proc.returncode, "wall_s": round(time.perf_counter() - t0, 2)}
            job["status"] = "done" if proc.returncode == 0 else "killed" if "killed" in job else "failed"
            summary = work / "models" / m / a.symbol / f"fold-{k}" / "summary.json"
            if proc.returncode == 0 and summary.exists():
                s = json.loads(summary.read_text())
                job |= {key: s.get(key) for key in ("epochs", "early_stopped", "best_mean_auc", "val_auc", "device")}
                job["train_s"] = s.get("wall_time_s")
            elif proc.returncode:
                job["error"] = tail(Path(job["log"]))
            jobs[f"{m}/{k}"] = job
            print(f"  {m} fold {k}: {job['status']} in {job['wall_s']:.1f} s, AUC {job.get('best_mean_auc')}", flush=True)
            write(a.out, out)
        time.sleep(0.5)


def evaluate_all(a: argparse.Namespace, work: Path, out: dict) -> None:
    """Both policies at once, each with half the cores; the requested (member, fold) pairs are `--expected`, so a
    missing checkpoint is listed as excluded in the report rather than silently absent."""
    expected = ",".join(f"{m}:{k}" for m in a.models.split(",") for k in a.folds.split(","))
    env = child_env(max(1, len(os.sched_getaffinity(0)) // len(POLICIES)), work)
    procs = {}
    for policy in POLICIES:
        report = work / f"eval-{policy}" / "ensemble_report.json"
        shutil.rmtree(report.parent, ignore_errors=True)
        cmd = cli(
            "evaluate", "--models-dir", str(work / "models"), "--data-dir", str(work / "data" / a.symbol),
            "--output", str(report), "--predecoded-dir", str(work / "pd"), "--device", a.device,
            "--policy", policy, "--expected", expected,
        )  # fmt: skip
        procs[policy] = (start(cmd, work / "logs" / f"evaluate-{policy}.log", env), time.perf_counter(), report)
    for policy, (proc, t0, report) in procs.items():
        rc = proc.wait()
        step = {"rc": rc, "wall_s": round(time.perf_counter() - t0, 2), "log": str(work / "logs" / f"evaluate-{policy}.log")}
        print(f"evaluate --policy {policy}: {step['wall_s']:.1f} s, rc {rc}", flush=True)
        if rc == 0 and report.exists():
            step["report"] = str(report)
            out["results"][policy] = rows_of(json.loads(report.read_text()), a.symbol)
        else:
            step["error"] = tail(Path(step["log"]))
        out["steps"][f"evaluate_{policy}"] = step
        write(a.out, out)


def rows_of(report: dict, symbol: str) -> dict:
    """Per member and ensemble: Sharpe at 0 and 1 tick, turnover, capture, DSR and the policy fits' PBO, out of
    sample over the test folds, and the same per fold."""
    sym = report["symbols"].get(symbol, {"models": {}, "ensembles": {}})

    def row(r: dict) -> dict:
        m = r["oos"]
        pbos = [f["policy_pbo"] for f in r["folds"] if f.get("policy_pbo") is not None]
        return {
            "folds_evaluated": len(r["folds"]),  # a fold excluded (gate, blindness) leaves the row fewer test files
            "sessions": m["n_sessions"],
            "sharpe_0": m["sharpe_by_cost"].get("0"),
            "sharpe_1": m["sharpe_by_cost"].get("1"),
            "turnover": m["turnover"],
            "capture": r.get("capture"),
            "oracle_sharpe": r.get("oracle_sharpe"),
            "dsr": m["dsr"],
            "pbo": sum(pbos) / len(pbos) if pbos else None,  # mean over the folds' policy fits (None: no fit)
            "n_policies": r.get("n_policies"),
            "folds": [
                {
                    "fold": f["fold"],
                    "test_file": f["test_file"],
                    "sharpe_0": f["metrics"]["sharpe_by_cost"].get("0"),
                    "sharpe_1": f["metrics"]["sharpe_by_cost"].get("1"),
                    "turnover": f["metrics"]["turnover"],
                    "oracle_sharpe": f.get("oracle_sharpe"),
                    "pbo": f.get("policy_pbo"),
                    "policy": f.get("policy"),
                }
                for f in r["folds"]
            ],
        }

    return {
        "cost_ticks": report["cost_ticks"],
        "members": {name: row(r) for name, r in sym["models"].items()},
        "ensembles": {name: row(r) for name, r in sym["ensembles"].items()},
        "excluded": [f"{e['model']} fold {e['fold']}: {e['reason']}" for e in report["excluded"]],
    }


def goal(results: dict, n_members: int) -> dict | None:
    fitted = results.get("fitted")
    if fitted is None:
        return None
    positive = sorted(n for n, r in fitted["members"].items() if n != FLAGSHIP and (r["sharpe_1"] or 0) > 0)
    ens = {n: (r["sharpe_1"] or 0) > 0 for n, r in fitted["ensembles"].items()}
    flagship = fitted["members"].get(FLAGSHIP, {}).get("capture")
    return {
        "flagship_capture": flagship,  # the goal: >= 0.3 on a realistic book
        "members_positive_at_1_tick": positive,
        "count": len(positive),
        "of": n_members,
        "needed": GOAL_MEMBERS,
        "ensembles_positive_at_1_tick": ens,
        "met": len(positive) >= GOAL_MEMBERS and bool(ens) and all(ens.values()),
    }


def print_table(out: dict) -> None:
    def f(v: float | None, d: int = 2) -> str:
        return "n/a" if v is None else f"{v:.{d}f}"

    res = out["results"]
    models = out["settings"]["models"].split(",")
    names = list(dict.fromkeys([*models, *(n for p in res.values() for n in p["ensembles"])]))
    cols = ("folds", "S@0", "S@1", "turn", "capt", "DSR", "PBO")
    print(f"\n{'':20} | {'fixed rule':^48} | {'fitted policy':^48}")
    print(f"{'row':20} | " + " | ".join(" ".join(f"{c:>6}" for c in cols) for _ in POLICIES))
    for name in names:
        cells = []
        for policy in POLICIES:
            p = res.get(policy, {})
            r = p.get("members", {}).get(name) or p.get("ensembles", {}).get(name)
            if r is None:  # not evaluated, or every fold excluded (listed below)
                cells.append(" ".join(f"{'-':>6}" for _ in cols))
                continue
            vals = (
                str(r["folds_evaluated"]),
                *(f(r[k]) for k in ("sharpe_0", "sharpe_1")),
                f(r["turnover"], 3),
                *(f(r[k]) for k in ("capture", "dsr", "pbo")),
            )
            cells.append(" ".join(f"{v:>6}" for v in vals))
        print(f"{name:20} | " + " | ".join(cells))
    excluded = {policy: p["excluded"] for policy, p in res.items()}
    if len({tuple(e) for e in excluded.values()}) == 1:  # the same checkpoints for both policies (the usual case)
        excluded = {"both policies": next(iter(excluded.values()))}
    for policy, items in excluded.items():
        for e in items:
            print(f"excluded ({policy}): {e}")
    print(
        "folds: test folds in the row; S@0, S@1: out-of-sample Sharpe at 0 and 1 tick; turn: position changes a bar; "
        "capt: Sharpe / the oracle's through the same policy; PBO: mean over the folds' policy fits"
    )
    g = out.get("goal")
    if g:
        print(
            f"\nfitted policy, 1 tick: {g['count']} of {g['of']} members positive "
            f"({', '.join(g['members_positive_at_1_tick'])}), "
            f"ensembles {g['ensembles_positive_at_1_tick']}; goal (>= {g['needed']}, a member without a row counts "
            f"as not positive, and the ensembles): "
            f"{'met' if g['met'] else 'not met'}"
        )


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.table:
        print_table(json.loads(a.table.read_text()))
        return 0
    began = time.perf_counter()
    work = a.work_dir.resolve()
    for sub in ("models", "logs", "eval-fixed", "eval-fitted", "compile-cache"):
        shutil.rmtree(work / sub, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    at_defaults = a.epochs is None and not a.set
    import torch  # the machine, for the record

    out = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "machine": {
            "cores": len(os.sched_getaffinity(0)),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "at_defaults": at_defaults,  # False: --epochs or --set changed the trainer's defaults (a smoke run)
        "steps": {},
        "train": {},
        "results": {},
    }
    write(a.out, out)
    prepare_data(a, work, child_env(len(os.sched_getaffinity(0)), work), out)
    write(a.out, out)
    train_all(a, work, out, began)
    out["steps"]["elapsed_after_training_s"] = round(time.perf_counter() - began, 2)
    write(a.out, out)
    evaluate_all(a, work, out)
    out["goal"] = goal(out["results"], len([m for m in a.models.split(",") if m != FLAGSHIP]))
    out["total_wall_s"] = round(time.perf_counter() - began, 2)
    write(a.out, out)
    print_table(out)
    print(f"\n{out['total_wall_s']:.0f} s in all; written: {a.out}")
    failed = [k for k, j in out["train"].items() if j.get("status") == "failed"]
    return 1 if failed or any(out["steps"].get(f"evaluate_{p}", {}).get("rc") for p in POLICIES) else 0


if __name__ == "__main__":
    sys.exit(main())
