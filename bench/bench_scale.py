"""Each data-dependent cost of the pipeline at the original workload's size, against the small demo, with its
scaling law (issue 22 item 2, issue 23 item 6).

Three data sets of ES.FUT, 8 quarterly files each (so every size has the same fold plan: 3 folds, a training
window of 4 files), that differ only in how long a file is:

- small: `alpha demo-data --scale small --quarters 8` (5 sessions a quarter, ~3,600 bars, ~25k book snapshots);
- mid:   scale `real` capped to the 21 sessions around each roll, with one book session (~29k bars, ~0.7M snapshots);
- real:  `alpha demo-data --scale real` (every session: ~87k bars a quarter; 3 book sessions, ~2.1M snapshots).

Every cost runs as its own process under `nice`, one thread (OMP_NUM_THREADS=1, ALPHA_CPUS_PER_STEP=1): CPU
seconds (user + system, `os.wait4`) are the figure that holds on a shared 2-core machine; peak RSS is the
child's `ru_maxrss`. Inside the child the CLI command runs through `alpha_core.cli.main` with CPU timers around
the phases (setup: sidecars, norm, loaders or env; train; validation; evaluation's predictions). The scaling
exponent k is the least-squares slope of log(cost) on log(rows per file) over the sizes measured: k ~ 1 grows
with the data, k ~ 0 does not, k > 1.15 grows worse than the data. A job whose projection at the next size
exceeds --budget-s CPU seconds is not run there; its projected cost is reported instead.

    nice .venv/bin/python bench/bench_scale.py                       # every job, every size (~1.5 CPU-hours)
    .venv/bin/python bench/bench_scale.py --sizes small,mid --jobs predecode,folds,kan,evaluate
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYMBOL = "ES.FUT"
SIZES = ("small", "mid", "real")
SUPERVISED = ("tft", "mamba2", "tlob", "kan", "xlstm", "tggn", "diffusion", "liquid")
RL = ("dqn", "ppo")
JOBS = ("gen", "predecode", "folds", *SUPERVISED, *RL, "perception", "evaluate")
TRAIN_ARGS = ["--epochs", "1", "--cv-n-folds", "3", "--cv-fold", "0", "--device", "cpu", "--quiet"]
SUPERVISED_ARGS = ["--n-train-seqs", "512", "--n-val-seqs", "512", "--batch-size", "64"]
RL_ARGS = ["--timesteps-per-epoch", "2048"]
PERCEPTION_ARGS = ["--n-train-seqs", "128", "--n-val-seqs", "256", "--batch-size", "16"]
EVAL_ARGS = ["--device", "cpu", "--min-val-auc", "0", "--min-val-sharpe", "-1000000", "--quiet"]
CHILD_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "ALPHA_CPUS_PER_STEP": "1",
    "PYTHONHASHSEED": "0",
}


# --- data ------------------------------------------------------------------------------------------------------


def generate(size: str, out: Path) -> None:
    """Write one size's ES.FUT data set (runs in a child)."""
    from alpha_core.data import demo
    from alpha_core.data.products import product

    if size == "small":
        demo.generate_demo_data(out, "small", seed=7, symbols=[SYMBOL], quarters=8)
    elif size == "real":
        demo.generate_demo_data(out, "real", seed=7, symbols=[SYMBOL])
    else:  # mid: the real density, 21 sessions around each roll, one of them with a book
        sc = dataclasses.replace(demo.SCALES["real"], name="mid", sessions_per_quarter=21, book_sessions=1)
        for k in range(sc.quarters):
            demo._write_real_quarter(out, product(SYMBOL), 2024 + k // 4, k % 4 + 1, sc, 7)


# --- the child: one command, with CPU timers around its phases ---------------------------------------------------


class Phases:
    """CPU seconds (all threads, `time.process_time`) spent inside wrapped functions, by phase."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}

    def wrap(self, owner, name: str, phase: str) -> None:
        fn = getattr(owner, name, None)
        if fn is None:
            return  # this version of the code has no such function: that phase stays unmeasured

        def timed(*args, **kwargs):
            t = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[phase] = self.cpu.get(phase, 0.0) + time.process_time() - t

        setattr(owner, name, timed)


def child(spec: dict) -> dict:
    t0 = time.process_time()
    ph = Phases()
    kind = spec["kind"]
    if kind == "gen":
        generate(spec["size"], Path(spec["out"]))
        return {"phases": {"work": time.process_time() - t0}}
    if kind == "supervised":
        from alpha_core.train import supervised as m

        for name, phase in (
            ("walk_forward", "sidecars"),
            ("fit_norm_stats", "fold_setup"),
            ("WindowLoader", "fold_setup"),
            ("_validate", "val"),
            ("_train_fold", "fold"),
        ):
            ph.wrap(m, name, phase)
    elif kind == "rl":
        from alpha_core.train import rl as m

        for name, phase in (
            ("walk_forward", "sidecars"),
            ("fit_norm_stats", "fold_setup"),
            ("TradingVecEnv", "fold_setup"),
            ("evaluate", "val"),
            ("_train_fold", "fold"),
        ):
            ph.wrap(m, name, phase)
    elif kind == "perception":
        from alpha_core.train.perception import PerceptionTrainer as m

        for name, phase in (("_prepare_data", "setup"), ("train_epoch", "train"), ("validate_epoch", "val")):
            ph.wrap(m, name, phase)
    elif kind == "evaluate":
        from alpha_core.eval import evaluate as m

        for name, phase in (("_predict_checked", "predict"), ("evaluate", "evaluate")):
            ph.wrap(m, name, phase)
    from alpha_core.cli import main

    t1 = time.process_time()
    rc = main(spec["argv"])
    cpu = dict(ph.cpu)
    if "fold" in cpu:  # setup = sidecars (outside the fold) + norm and loaders/env (inside); train = the rest
        fold_setup = cpu.pop("fold_setup", 0.0)
        cpu["train"] = cpu.pop("fold") - cpu.get("val", 0.0) - fold_setup
        cpu["setup"] = cpu.get("sidecars", 0.0) + fold_setup
    cpu["command"] = time.process_time() - t1
    return {"rc": rc, "phases": cpu, "imports": t1 - t0}


# --- the parent -------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    job: str
    size: str
    rows: int  # rows per file of the schema the job reads (the scaling axis)
    cpu_s: float | None = None  # whole process, user + system
    wall_s: float | None = None
    rss_mib: float | None = None
    phases: dict = dataclasses.field(default_factory=dict)
    command: str = ""
    projected_cpu_s: float | None = None  # not run: the projection that exceeded the budget
    error: str | None = None


def run_child(spec: dict, log: Path) -> tuple[dict, float, float, float, int]:
    """Run `spec` in a niced child; (its result, CPU s, wall s, peak RSS MiB, exit status)."""
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT)}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        start = time.perf_counter()
        proc = subprocess.Popen(
            ["nice", "-n", "10", sys.executable, __file__, "--child", json.dumps(spec)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
    out = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("@@RESULT "):
            out = json.loads(line[len("@@RESULT ") :])
    return out, ru.ru_utime + ru.ru_stime, wall, ru.ru_maxrss / 1024, proc.returncode


def sidecar_rows(pd: Path, kind: str) -> list[int]:
    import numpy as np

    return [
        int(np.load(d / "ts.npy", mmap_mode="r").shape[0])
        for d in sorted(pd.glob(f"*.ES.{kind}.*"))
        if (d / "meta.json").is_file()
    ]


def fit_k(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(cost) on log(rows)."""
    pts = [(math.log(r), math.log(c)) for r, c in points if r > 0 and c and c > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return None if sxx == 0 else sum((x - mx) * (y - my) for x, y in pts) / sxx


def cmd(argv: list[str]) -> str:
    return "alpha " + " ".join(argv)


class Bench:
    def __init__(self, out: Path, budget_s: float, max_rss_gib: float) -> None:
        self.out, self.budget_s, self.max_rss_mib = out, budget_s, max_rss_gib * 1024
        self.results: list[Result] = []
        path = out / "bench_scale.json"
        if path.is_file():  # keep the results of sizes/jobs not rerun
            old = json.loads(path.read_text())
            self.results = [Result(**r) for r in old.get("results", [])]

    def data(self, size: str) -> Path:
        return self.out / size / "data"

    def pd(self, size: str) -> Path:
        return self.out / size / "predecoded"

    def runs(self, size: str) -> Path:
        return self.out / size / "runs"

    def record(self, r: Result) -> Result:
        self.results = [x for x in self.results if (x.job, x.size) != (r.job, r.size)] + [r]
        self.save()
        shown = f"{r.cpu_s:8.1f} s CPU, {r.rss_mib:7.0f} MiB" if r.cpu_s is not None else f"ERROR {r.error}"
        phases = " ".join(f"{k} {v:.2f}" for k, v in r.phases.items() if isinstance(v, float))
        print(f"  {r.size:5} {r.job:22} rows/file {r.rows:>9,}  {shown}  [{phases}]", flush=True)
        return r

    def save(self) -> None:
        (self.out / "bench_scale.json").write_text(
            json.dumps({"machine": machine(), "results": [dataclasses.asdict(r) for r in self.results]}, indent=1)
        )

    def projected(self, job: str, rows: int) -> tuple[float, float] | None:
        """(CPU s, peak RSS MiB) projected at `rows` from this job's smaller sizes: CPU with the fitted k (at least
        1), RSS on the line through the two largest."""
        done = sorted(
            (r for r in self.results if r.job == job and r.cpu_s is not None and 0 < r.rows < rows), key=lambda r: r.rows
        )
        if not done:
            return None
        k = fit_k([(r.rows, r.cpu_s) for r in done]) or 1.0
        last = done[-1]
        rss = last.rss_mib
        if len(done) >= 2 and done[-1].rows > done[-2].rows:
            slope = (done[-1].rss_mib - done[-2].rss_mib) / (done[-1].rows - done[-2].rows)
            rss += max(slope, 0.0) * (rows - last.rows)
        return last.cpu_s * (rows / last.rows) ** max(k, 1.0), rss

    def run(self, job: str, size: str, rows: int, spec: dict, argv: list[str], record: bool = True) -> Result:
        spec = {**spec, "argv": argv}
        proj = self.projected(job, rows) if rows else None
        if proj is not None and (proj[0] > self.budget_s or proj[1] > self.max_rss_mib):
            r = Result(
                job,
                size,
                rows,
                command=cmd(argv),
                projected_cpu_s=proj[0],
                error=f"not run: projected {proj[0]:.0f} s CPU, {proj[1] / 1024:.1f} GiB peak RSS",
            )
            return self.record(r)
        log = self.out / size / "logs" / f"{job.replace(' ', '_')}.log"
        out, cpu, wall, rss, rc = run_child(spec, log)
        err = None if rc == 0 and out.get("rc", 0) == 0 else f"exit {rc}, {out.get('rc')}; see {log}"
        r = Result(job, size, rows, cpu, wall, rss, out.get("phases", {}), cmd(argv), error=err)
        return self.record(r) if record else r

    # --- jobs ---

    def gen(self, size: str) -> None:
        data = self.data(size)
        if (data / ".complete").is_file():
            return
        shutil.rmtree(data, ignore_errors=True)
        out, cpu, wall, rss, rc = run_child(
            {"kind": "gen", "size": size, "out": str(data)}, self.out / size / "logs" / "gen.log"
        )
        if rc != 0:
            raise SystemExit(f"generating {size} failed; see {self.out / size / 'logs' / 'gen.log'}")
        (data / ".complete").write_text("")
        n = sum(1 for _ in data.rglob("*.dbn.zst"))
        self.record(Result("gen", size, 0, cpu, wall, rss, {"n_files": float(n)}, f"bench_scale.generate({size!r})"))

    def predecode(self, size: str) -> dict[str, int]:
        """Cold builds of each schema's sidecars (measured), kept as the cache every later job reuses."""
        rows = {}
        for schema, kind in (("ohlcv-1m", "bars"), ("mbp-10", "book")):
            stage = self.out / size / f"stage-{schema}" / SYMBOL / schema
            if not stage.is_dir():
                stage.mkdir(parents=True)
                for f in sorted((self.data(size) / SYMBOL / schema).glob("*.dbn.zst")):
                    os.link(f, stage / f.name)
                oracle = stage.parent / "oracle"  # the sidecars name these paths: the report finds the oracle here
                oracle.mkdir(exist_ok=True)
                for f in sorted((self.data(size) / SYMBOL / "oracle").glob("*.npz")):
                    if not (oracle / f.name).exists():
                        os.link(f, oracle / f.name)
            tmp = self.out / size / f"predecode-{schema}"
            shutil.rmtree(tmp, ignore_errors=True)
            argv = ["predecode", "--data-dir", str(stage.parent), "--output-dir", str(tmp), "--symbols", SYMBOL, "--quiet"]
            r = self.run(f"predecode {schema}", size, 0, {"kind": "cli"}, argv, record=False)
            per_file = sidecar_rows(tmp / SYMBOL, kind)
            r.rows = rows[schema] = int(sum(per_file) / max(len(per_file), 1))
            r.phases["n_files"] = float(len(per_file))
            self.record(r)
            cache = self.pd(size) / SYMBOL
            cache.mkdir(parents=True, exist_ok=True)
            for d in (tmp / SYMBOL).iterdir():
                if not (cache / d.name).exists():
                    d.rename(cache / d.name)
            shutil.rmtree(tmp)
        return rows

    def folds(self, size: str, rows: dict[str, int]) -> None:
        for schema in ("ohlcv-1m", "mbp-10"):
            argv = ["folds", "--data-dir", str(self.data(size) / SYMBOL), "--cv-n-folds", "3", "--schema", schema, "--json"]
            self.run(f"folds {schema}", size, rows[schema], {"kind": "cli"}, argv)

    def train(self, model: str, size: str, rows: dict[str, int]) -> None:
        out = self.runs(size) / model / "models" / model / SYMBOL
        shutil.rmtree(out, ignore_errors=True)
        if model == "perception":
            argv = [
                "train",
                "--mbp10-data-dir",
                str(self.data(size) / SYMBOL / "mbp-10"),
                "--predecoded-dir",
                str(self.pd(size) / SYMBOL),
                "--out",
                str(out),
                *TRAIN_ARGS,
                *PERCEPTION_ARGS,
            ]
            self.run(f"train {model}", size, rows["mbp-10"], {"kind": "perception"}, argv)
            if (out / "alpha_train_summary.json").is_file() and not (out / "fold-0").exists():
                fold = out.resolve()  # an `alpha train` that promotes one fold to --out itself (a link)
                out.unlink() if out.is_symlink() else out.rename(fold := out.with_name(".fold-0"))
                out.mkdir()
                fold.rename(out / "fold-0")
        else:
            group = "rl" if model in RL else "supervised"
            argv = [
                f"train-{'rl' if group == 'rl' else 'supervised'}",
                "--model",
                model,
                "--data-dir",
                str(self.data(size) / SYMBOL),
                "--output-dir",
                str(out),
                "--predecoded-dir",
                str(self.pd(size) / SYMBOL),
                *TRAIN_ARGS,
                *(RL_ARGS if group == "rl" else SUPERVISED_ARGS),
            ]
            self.run(f"train {model}", size, rows["ohlcv-1m"], {"kind": group}, argv)

    def evaluate(self, model: str, size: str, rows: dict[str, int]) -> None:
        models = self.runs(size) / model / "models"
        if not any(models.glob(f"{model}/{SYMBOL}/fold-0/*")):
            return self.record(Result(f"evaluate {model}", size, 0, error="no checkpoint (training failed?)"))
        report = self.runs(size) / model / "eval" / "ensemble_report.json"
        argv = [
            "evaluate",
            "--models-dir",
            str(models),
            "--data-dir",
            str(self.data(size)),
            "--output",
            str(report),
            "--predecoded-dir",
            str(self.pd(size)),
            *EVAL_ARGS,
        ]
        axis = rows["mbp-10"] if model == "perception" else rows["ohlcv-1m"]
        self.run(f"evaluate {model}", size, axis, {"kind": "evaluate"}, argv)


def machine() -> dict:
    import platform

    load = os.getloadavg()
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")),
        "?",
    )
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    if not commit.strip() and (ROOT / ".commit").is_file():  # a `git archive` of a commit, run outside the repo
        commit = (ROOT / ".commit").read_text()
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "load_avg": load,
        "python": platform.python_version(),
        "commit": commit.strip() or "?",
        "dirty": bool(dirty.strip()),
        "root": str(ROOT),
    }


def table(results: list[Result]) -> str:
    """One line per cost: CPU s and peak RSS by size, k over the sizes measured, the phases' own k."""
    by_job: dict[str, dict[str, Result]] = {}
    for r in results:
        by_job.setdefault(r.job, {})[r.size] = r
    lines = [
        "| cost | rows/file small / mid / real | CPU s small | mid | real | k (cost ~ rows^k) | peak RSS MiB "
        "small / real | phases at real (CPU s, k) |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for job, rs in by_job.items():

        def cell(size: str, rs: dict[str, Result] = rs) -> str:
            r = rs.get(size)
            if r is None:
                return "-"
            if r.cpu_s is None:
                return f"not run ({r.projected_cpu_s:.0f} projected)" if r.projected_cpu_s else "error"
            return f"{r.cpu_s:.1f}"

        measured = [(r.rows, r.cpu_s) for r in rs.values() if r.cpu_s is not None and r.rows]
        k = fit_k(measured)
        rows = " / ".join(f"{rs[s].rows:,}" if s in rs else "-" for s in SIZES)
        rss = " / ".join(f"{rs[s].rss_mib:.0f}" if s in rs and rs[s].rss_mib else "-" for s in ("small", "real"))
        big = rs.get("real") if rs.get("real") and rs["real"].cpu_s is not None else rs.get("mid")
        ph = []
        if big and big.cpu_s is not None:
            for name, v in big.phases.items():
                if name in ("command", "n_files", "work") or not isinstance(v, float):
                    continue
                pk = fit_k(
                    [
                        (r.rows, r.phases.get(name))
                        for r in rs.values()
                        if r.cpu_s is not None and isinstance(r.phases.get(name), float)
                    ]
                )
                ph.append(f"{name} {v:.1f}" + (f" (k {pk:.2f})" if pk is not None else ""))
        lines.append(
            f"| {job} | {rows} | {cell('small')} | {cell('mid')} | {cell('real')} | "
            f"{'-' if k is None else f'{k:.2f}'} | {rss} | {', '.join(ph)} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "scale", help="data, caches, runs, JSON")
    p.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated of {','.join(SIZES)}")
    p.add_argument("--jobs", default="all", help=f"comma-separated of {','.join(JOBS)}, or all")
    p.add_argument(
        "--budget-s",
        type=float,
        default=1800.0,
        help="skip a job at a size where its projected CPU seconds exceed this (default: %(default)s)",
    )
    p.add_argument(
        "--max-rss-gib",
        type=float,
        default=8.0,
        help="skip a job at a size where its projected peak RSS exceeds this (default: %(default)s)",
    )
    p.add_argument("--table", action="store_true", help="only print the table of the saved results")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print("@@RESULT " + json.dumps(child(json.loads(a.child))), flush=True)
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    bench = Bench(a.out, a.budget_s, a.max_rss_gib)
    if a.table:
        print(table(bench.results))
        return 0
    jobs = JOBS if a.jobs == "all" else tuple(a.jobs.split(","))
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        p.error(f"unknown job(s) {','.join(unknown)}")
    print(f"bench_scale: {machine()}", flush=True)
    base = run_child({"kind": "cli", "argv": ["models"]}, a.out / "logs" / "baseline.log")
    print(f"  baseline process (`alpha models`: interpreter, imports): {base[1]:.1f} s CPU, {base[3]:.0f} MiB", flush=True)
    for size in a.sizes.split(","):
        print(f"{size}:", flush=True)
        bench.gen(size)
        if "predecode" in jobs or not bench.pd(size).is_dir():
            rows = bench.predecode(size)
        else:
            cache = bench.pd(size) / SYMBOL
            rows = {
                "ohlcv-1m": int(sum(x := sidecar_rows(cache, "bars")) / max(len(x), 1)),
                "mbp-10": int(sum(y := sidecar_rows(cache, "book")) / max(len(y), 1)),
            }
        if "folds" in jobs:
            bench.folds(size, rows)
        for model in (*SUPERVISED, *RL, "perception"):
            if model in jobs:
                bench.train(model, size, rows)
                if "evaluate" in jobs:
                    bench.evaluate(model, size, rows)
    print()
    print(table(bench.results))
    print(f"\n{a.out / 'bench_scale.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
