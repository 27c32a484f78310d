"""One symbol's full ensemble, job by job, each job in a fresh process (as a pod runs it): wall time, device and
GPU utilisation per job, and what the whole costs and how long it takes with MAX_PARALLEL pods.

    .venv/bin/python bench/bench_ensemble.py --data-dir DATA/ES.FUT [--predecoded-dir PD] [--epochs 2 --trials 1]

The jobs are the pipeline's (alpha_assets/defs/checkpoints.py, hyperopt.py), calling the same alpha_core functions the assets
call, without Dagster (the GPU machine has none): `hyperopt/<model>` for each searchable model (PSO,
alpha_core/hyperopt/pso.py), `train/<model>/<fold>` for every registry model and walk-forward fold (its hyperopt's
best params when that ran), then `evaluate` (alpha_core/eval) over every checkpoint. Each job runs on the device its
production pod has (`DEVICE_OF`, overridable with `--device-of MODEL=DEV`).

The seed's defaults are EPOCHS=50 with early stopping, HYPEROPT_TRIALS=20 PSO trials (10 epochs per RL trial, the
search's default per supervised trial), the flagship's `alpha train` defaults (5 epochs x 8,000 sequences at B=1)
and 3 folds; everything else is the trainers' own defaults. To fit a 10-minute device call, `--epochs`, `--trials`,
`--trial-epochs`, `--flagship-epochs` and `--folds` run less, and the report projects each job linearly to the
seed's numbers: a job's fixed cost (process start, imports, data, compilation outside the epoch loop) is kept,
and the part that grows with epochs or trials is scaled. Every projected figure says so and by what factor.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import heapq
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC_COST_ROW = {  # the seed's spec, "Cost Estimate (H100 ~EUR 3/hr)": "Full ensemble, single symbol"
    "source": "spec, Cost Estimate (H100 ~EUR 3/hr): | Full ensemble, single symbol | 14 | ~1hr (parallel) | ~EUR 16 |",
    "jobs": 14,
    "wall": "~1 hr (parallel)",
    "eur": 16.0,
    "eur_per_gpu_hour": 3.0,
    "gpu_hours": 16.0 / 3.0,
}
# Production placement (issue 13, item 2): supervised members and the flagship on GPU pods; the RL agents, their
# training and their hyperopt, on CPU pods (SB3's MLP policies leave a GPU idle while the environment steps on the
# CPU); the report on a CPU pod (`ensemble_report` holds the `cpu` pool and asks for no GPU). Keyed by trainer;
# `--device-of` overrides per model, `evaluate`, or `all`.
DEVICE_OF = {"perception": "cuda", "supervised": "cuda", "rl": "cpu", "evaluate": "cpu"}
MARKER = ".bench_ensemble"  # a work dir this bench may empty
EUR_PER_CPU_HOUR = 0.5  # assumption, not in the original system: one hour of a 16-vCPU, 32 GB node (a CPU training pod's node)
NOTES = [
    "wall_s: the job's process from start to exit (interpreter, imports, data, compilation, training), as a pod.",
    "projected_s = (wall_s - work_s) + work_s * factor: work_s is the part that grows with the scaled quantity (the "
    "trainer's epoch loop, the sum of the hyperopt trials, the evaluation call), the rest is kept as measured. "
    "A training run of two epochs or more is projected as wall_s + the remaining epochs x its last epoch's time "
    "(the first epoch carries any compilation).",
    "A training run projected from fewer epochs is an upper bound: at the seed's 50 epochs early stopping "
    "(patience 5) may end it sooner. A run that stopped early within its epochs is not scaled.",
    "A fold that was not run is the mean of the same model's folds that ran.",
    "GPU-hours: the projected wall time of the jobs on GPU pods. CPU-hours: of the jobs on CPU pods (pod-hours, "
    "not core-hours). EUR: GPU-hours x eur_per_gpu_hour + CPU-hours x eur_per_cpu_hour (an assumption).",
    "The schedule: greedy list scheduling of the projected durations (longest chain after a job first), at most "
    "max_parallel.gpu GPU pods and max_parallel.cpu CPU pods at once.",
]


def repo_default(path: str, name: str):
    """A literal default from the repo's source, read without importing it (the GPU machine has no Dagster)."""
    for node in ast.walk(ast.parse((REPO / path).read_text())):
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(target, ast.Name) and target.id == name:
            return ast.literal_eval(node.value)
    raise LookupError(f"{path}: no default for {name}")


# --- the plan ---------------------------------------------------------------------------------------------


@dataclass
class Job:
    id: str  # hyperopt/<model>, train/<model>/<fold>, evaluate
    stage: str  # hyperopt | train | evaluate
    model: str | None
    fold: int | None
    trainer: str  # perception | supervised | rl | evaluate
    device: str
    deps: list[str]
    run: bool = True
    skipped: str = ""  # why it does not run: "--jobs" (no figure), "--folds" (projected from the folds that ran)
    result: dict = field(default_factory=dict)

    @property
    def pool(self) -> str:
        return "gpu" if self.device.startswith("cuda") else "cpu"


def device_table(registry_specs: dict, overrides: list[str]) -> dict[str, str]:
    """Model (and `evaluate`) -> device: the production placement, then `--device-of` in order."""
    table = {name: DEVICE_OF[spec.trainer] for name, spec in registry_specs.items()} | {"evaluate": DEVICE_OF["evaluate"]}
    for item in overrides:
        key, sep, dev = item.partition("=")
        if not sep or not dev or (key not in table and key != "all"):
            raise SystemExit(f"--device-of {item!r}: expected MODEL=DEVICE with MODEL one of all, {', '.join(table)}")
        table = dict.fromkeys(table, dev) if key == "all" else table | {key: dev}
    return table


def plan_jobs(
    registry_specs: dict, devices: dict[str, str], n_folds: int, folds_run: list[int], patterns: list[str] | None
) -> list[Job]:
    """hyperopt of a model -> that model's folds -> evaluate, listed stage by stage; `patterns` (fnmatch on ids,
    or a model name) and `folds_run` choose what runs."""
    jobs = [
        Job(f"hyperopt/{name}", "hyperopt", name, None, spec.trainer, devices[name], [])
        for name, spec in registry_specs.items()
        if spec.search_space is not None
    ]
    for name, spec in registry_specs.items():
        hyper = f"hyperopt/{name}" if spec.search_space is not None else None
        jobs += [
            Job(
                f"train/{name}/{k}",
                "train",
                name,
                k,
                spec.trainer,
                devices[name],
                [hyper] if hyper else [],
                run=k in folds_run,
                skipped="" if k in folds_run else "--folds",
            )
            for k in range(n_folds)
        ]
    jobs.append(
        Job("evaluate", "evaluate", None, None, "evaluate", devices["evaluate"], [j.id for j in jobs if j.stage == "train"])
    )
    for job in jobs:
        if patterns and not any(p == job.model or fnmatch.fnmatchcase(job.id, p) for p in patterns):
            job.run, job.skipped = False, "--jobs"
    return jobs


# --- projection and schedule (pure) ---------------------------------------------------------------------


def project(wall_s: float, work_s: float, factor: float) -> float:
    """The pod's wall time at the seed's numbers: the fixed part as measured, the scalable part times `factor`."""
    work_s = min(max(work_s, 0.0), wall_s)
    return wall_s - work_s + work_s * factor


def train_factor(seed_epochs: int, epochs_run: int, early_stopped: bool) -> float:
    """Epochs the seed would train / epochs trained. A run that stopped early would have stopped there at the seed's
    epochs too (same patience), so it is not scaled; one that did not is scaled to all the seed's epochs, an upper
    bound, since the seed's run may stop early."""
    return 1.0 if early_stopped else seed_epochs / max(epochs_run, 1)


def bottom_levels(durations: dict[str, float], deps: dict[str, list[str]]) -> dict[str, float]:
    """Each job's duration plus the longest chain of jobs after it (the list scheduler's priority)."""
    after: dict[str, list[str]] = {j: [] for j in durations}
    for job, before in deps.items():
        for d in before:
            after[d].append(job)
    levels: dict[str, float] = {}

    def level(j: str) -> float:
        if j not in levels:
            levels[j] = durations[j] + max((level(s) for s in after[j]), default=0.0)
        return levels[j]

    for j in durations:
        level(j)
    return levels


def schedule(
    durations: dict[str, float], deps: dict[str, list[str]], pool_of: dict[str, str], caps: dict[str, int]
) -> tuple[float, dict[str, tuple[float, float]]]:
    """Greedy list scheduling: whenever a pod slot of a job's pool is free, start the ready job with the longest
    chain after it. Returns the makespan and each job's (start, end)."""
    levels = bottom_levels(durations, deps)
    waiting = {j: set(deps.get(j, ())) for j in durations}
    ready = [(-levels[j], j) for j, w in waiting.items() if not w]
    heapq.heapify(ready)
    running: list[tuple[float, str]] = []
    busy = dict.fromkeys(caps, 0)
    times: dict[str, tuple[float, float]] = {}
    now = 0.0
    while ready or running:
        held = []
        while ready:
            prio, j = heapq.heappop(ready)
            if busy[pool_of[j]] < caps[pool_of[j]]:
                busy[pool_of[j]] += 1
                times[j] = (now, now + durations[j])
                heapq.heappush(running, (now + durations[j], j))
            else:
                held.append((prio, j))
        for item in held:
            heapq.heappush(ready, item)
        if not running:
            raise ValueError(f"unschedulable jobs (a cycle, or a pool with no slots): {sorted(j for _, j in ready)}")
        now, done = heapq.heappop(running)
        busy[pool_of[done]] -= 1
        for j, w in waiting.items():
            if done in w:
                w.discard(done)
                if not w:
                    heapq.heappush(ready, (-levels[j], j))
    return max((end for _, end in times.values()), default=0.0), times


# --- running one job (the child process, a pod) -----------------------------------------------------------


def child(spec_path: Path, result_path: Path) -> int:
    """Run one job; write what it did. Imports happen here, so they count in the pod's wall time."""
    spec = json.loads(spec_path.read_text())
    try:
        result = {"train": _run_train, "hyperopt": _run_hyperopt, "evaluate": _run_evaluate}[spec["stage"]](spec)
        rc = 0
    except BaseException as exc:  # the parent reports it beside the other jobs
        from alpha_core.errors import describe_validation_error  # one line per bad field; str(exc) otherwise

        error = f"{type(exc).__name__}: {describe_validation_error(exc)}"
        result, rc = {"error": error, "traceback": traceback.format_exc()[-3000:]}, 1
    result_path.write_text(json.dumps(result))
    return rc


def _settings(config_cls, spec: dict, **values) -> dict:
    """`values`, plus the `--set` overrides that this config has a field for."""
    return values | {k: v for k, v in spec["overrides"].items() if k in config_cls.model_fields}


def _common(spec: dict) -> dict:
    return {
        "cv_n_folds": spec["n_folds"],
        "cv_train_window": spec["cv_train_window"],
        "allow_untested_folds": spec["allow_untested_folds"],
    }


def _run_train(spec: dict) -> dict:
    from alpha_core.models import registry

    trainer, name, work = registry.get(spec["model"]).trainer, spec["model"], Path(spec["work"])
    data, pd, symbol = Path(spec["data_dir"]), Path(spec["predecoded_dir"]), spec["symbol"]
    out = work / "models" / name / symbol
    params = spec["params_file"] if spec["params_file"] and Path(spec["params_file"]).exists() else None
    common = _common(spec) | {"cv_fold": spec["fold"], "device": spec["device"]}
    started = time.perf_counter()
    if trainer == "perception":
        from alpha_core.train.perception import PerceptionTrainer, TrainConfig

        s = PerceptionTrainer(
            TrainConfig(
                **_settings(
                    TrainConfig,
                    spec,
                    mbp10_data_dir=data / "mbp-10",
                    predecoded_dir=pd,
                    out=out / f"fold-{spec['fold']}",
                    epochs=spec["epochs"],
                    **common,
                )
            )
        ).fit()
        metric = {"best_mean_auc": s.best_mean_auc, "sequences_per_s": s.sequences_per_s}
    elif trainer == "supervised":
        from alpha_core.train.supervised import SupervisedTrainConfig, train_supervised

        (s,) = train_supervised(
            SupervisedTrainConfig(
                **_settings(
                    SupervisedTrainConfig,
                    spec,
                    model=name,
                    data_dir=data,
                    output_dir=out,
                    predecoded_dir=pd,
                    symbol=symbol,
                    epochs=spec["epochs"],
                    **common,
                )
            ),
            params,
        )
        metric = {"best_mean_auc": s.best_mean_auc, "sequences_per_s": s.sequences_per_s}
    else:
        from alpha_core.train.rl import RLTrainConfig, train_rl

        (s,) = train_rl(
            RLTrainConfig(
                **_settings(
                    RLTrainConfig,
                    spec,
                    model=name,
                    data_dir=data,
                    output_dir=out,
                    predecoded_dir=pd,
                    symbol=symbol,
                    epochs=spec["epochs"],
                    **common,
                )
            ),
            params,
        )
        metric = {"val_sharpe": s.val_sharpe, "env_steps_per_s": s.env_steps_per_s}
    return {
        "call_s": time.perf_counter() - started,
        "work_s": s.wall_time_s,
        "epochs_run": s.epochs,
        "epoch_s": [m.get("epoch_s") for m in s.epoch_metrics],
        "early_stopped": s.early_stopped,
        "device_used": s.device,
        "stage_s": s.stage_s,  # where the fold's seconds went (alpha_core/stages.py)
        "params_file": params,
        **metric,
    }


def _run_hyperopt(spec: dict) -> dict:
    from alpha_core.hyperopt.pso import HyperoptConfig, hyperopt

    started = time.perf_counter()
    results = hyperopt(
        HyperoptConfig(
            **_settings(
                HyperoptConfig,
                spec,
                model=spec["model"],
                data_dir=Path(spec["data_dir"]),
                output=Path(spec["output"]),
                predecoded_dir=Path(spec["predecoded_dir"]),
                symbol=spec["symbol"],
                trials=spec["trials"],
                epochs=spec["epochs"],
                device=spec["device"],
                **_common(spec),
            )
        )
    )
    return {
        "call_s": time.perf_counter() - started,
        "work_s": sum(t["wall_s"] for t in results["trials"]),
        "trials_run": len(results["trials"]),
        "best_score": results["best_score"],
    }


def _run_evaluate(spec: dict) -> dict:
    from alpha_core.eval.evaluate import EvalConfig, evaluate

    work, symbol = Path(spec["work"]), spec["symbol"]
    pd_root = work / "pd-root"  # evaluate reads {predecoded}/{symbol}
    pd_root.mkdir(exist_ok=True)
    if not (pd_root / symbol).exists():
        (pd_root / symbol).symlink_to(Path(spec["predecoded_dir"]).resolve(), target_is_directory=True)
    started = time.perf_counter()
    report = evaluate(
        EvalConfig(
            models_dir=work / "models",
            data_dir=Path(spec["data_dir"]).parent,
            output=work / "eval" / "ensemble_report.json",
            symbols=[symbol],
            predecoded_dir=pd_root,
            device=spec["device"],
            hyperopt_results=spec["hyperopt_results"],
            gate=None,
        )
    )  # as the report asset runs it: every checkpoint is evaluated, whatever its validation score
    call = time.perf_counter() - started
    return {
        "call_s": call,
        "work_s": call,
        "rows": len(report.symbols[symbol].models) if symbol in report.symbols else 0,
        "excluded": [f"{e.model} fold {e.fold}: {e.reason}" for e in report.excluded],
    }


# --- the parent: run the jobs, poll the GPU, project, report -----------------------------------------------


class GpuPoll:
    """nvidia-smi sampling every 200 ms while one job runs; None where there is no nvidia-smi."""

    def __init__(self, path: Path) -> None:
        self.path, self.proc = path, None
        if shutil.which("nvidia-smi"):
            with path.open("w") as sink:
                self.proc = subprocess.Popen(
                    [
                        "nvidia-smi",
                        "-i",
                        "0",
                        "--query-gpu=utilization.gpu,memory.used",
                        "--format=csv,noheader,nounits",
                        "-lms",
                        "200",
                    ],
                    stdout=sink,
                    stderr=subprocess.DEVNULL,
                )

    def stop(self) -> dict | None:
        if self.proc is None:
            return None
        self.proc.terminate()
        self.proc.wait(timeout=10)
        samples = []
        for line in self.path.read_text().splitlines():
            try:
                util, mem = (float(x) for x in line.split(","))
            except ValueError:
                continue
            samples.append((util, mem))
        if not samples:
            return {"samples": 0, "util_mean": None, "util_max": None, "mem_max_mib": None}
        return {
            "samples": len(samples),
            "util_mean": round(sum(u for u, _ in samples) / len(samples), 1),
            "util_max": max(u for u, _ in samples),
            "mem_max_mib": max(m for _, m in samples),
        }


def run_job(job: Job, spec: dict, work: Path, pod_cores: int | None) -> dict:
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = job.id.replace("/", "_")
    spec_path, result_path = logs / f"{stem}.spec.json", logs / f"{stem}.result.json"
    spec_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if job.pool == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU pod has no GPU
    cores = sorted(os.sched_getaffinity(0))[:pod_cores] if pod_cores else None
    if cores:
        env |= {"OMP_NUM_THREADS": str(len(cores)), "MKL_NUM_THREADS": str(len(cores))}
    poll = GpuPoll(logs / f"{stem}.gpu.csv")
    started = time.perf_counter()
    with (logs / f"{stem}.log").open("w") as log:
        rc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path), str(result_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        ).returncode
    wall = time.perf_counter() - started
    gpu = poll.stop()
    result = (
        json.loads(result_path.read_text())
        if result_path.exists()
        else {"error": f"exit status {rc}, no result (see {logs / f'{stem}.log'})"}
    )
    return {
        "rc": rc,
        "wall_s": wall,
        "gpu": gpu,
        "cores": len(cores) if cores else len(os.sched_getaffinity(0)),
        "log": str(logs / f"{stem}.log"),
        **result,
    }


def fill_projections(jobs: list[Job], seed: dict, run: dict) -> None:
    """Each job's projected seconds at the seed's numbers, the factor, and whether the figure is projected."""
    for job in jobs:
        r = job.result
        if not r or r.get("rc") != 0:
            continue
        if job.stage == "train":
            seed_epochs = seed["flagship_epochs"] if job.model == "perception" else seed["epochs"]
            factor = train_factor(seed_epochs, r["epochs_run"], r["early_stopped"])
            basis = (
                f"stopped early at epoch {r['epochs_run']} (not scaled)"
                if r["early_stopped"]
                else f"{r['epochs_run']} of {seed_epochs} epochs"
            )
        elif job.stage == "hyperopt":
            seed_trial_epochs = seed["trial_epochs"][job.trainer]
            factor = (seed["trials"] / r["trials_run"]) * (seed_trial_epochs / run["trial_epochs"][job.trainer])
            basis = (
                f"{r['trials_run']} of {seed['trials']} trials x {run['trial_epochs'][job.trainer]} of "
                f"{seed_trial_epochs} epochs"
            )
        else:
            planned = sum(1 for j in jobs if j.stage == "train")
            factor = planned / max(r["checkpoints"], 1)
            basis = f"{r['checkpoints']} of {planned} checkpoints"
        projected_s = project(r["wall_s"], r["work_s"], factor)
        epoch_s = r.get("epoch_s") or []
        if job.stage == "train" and factor > 1 and len(epoch_s) >= 2 and None not in epoch_s:
            # the first epoch carries the compilation: the remaining epochs cost what the last one did
            remaining = r["epochs_run"] * (factor - 1)
            projected_s, basis = r["wall_s"] + remaining * epoch_s[-1], f"{basis}, the rest at the last epoch's time"
        r |= {"factor": factor, "projected_s": projected_s, "projected": not math.isclose(factor, 1.0), "basis": basis}
    for job in jobs:  # folds that did not run: the mean of the model's folds that did
        if job.stage != "train" or job.run or "rc" in job.result:
            continue
        done = [j for j in jobs if j.stage == "train" and j.model == job.model and j.result.get("rc") == 0]
        if done:
            job.result |= {
                "projected_s": sum(j.result["projected_s"] for j in done) / len(done),
                "projected": True,
                "factor": None,
                "basis": f"fold not run: mean of fold(s) {', '.join(str(j.fold) for j in done)}",
            }


def totals(jobs: list[Job], eur_gpu: float, eur_cpu: float, caps: dict[str, int]) -> dict:
    known = [j for j in jobs if "projected_s" in j.result]
    missing = [j.id for j in jobs if j not in known]
    hours = {p: sum(j.result["projected_s"] for j in known if j.pool == p) / 3600 for p in ("gpu", "cpu")}
    measured = {p: sum(j.result["wall_s"] for j in jobs if j.pool == p and "wall_s" in j.result) / 3600 for p in ("gpu", "cpu")}
    out = {
        "gpu_hours": hours["gpu"],
        "cpu_hours": hours["cpu"],
        "eur": hours["gpu"] * eur_gpu + hours["cpu"] * eur_cpu,
        "eur_per_gpu_hour": eur_gpu,
        "eur_per_cpu_hour": eur_cpu,
        "projected": any(j.result["projected"] for j in known),
        "measured_this_run": {"gpu_hours": measured["gpu"], "cpu_hours": measured["cpu"]},
        "complete": not missing,
        "missing_jobs": missing,
    }
    if known:
        durations = {j.id: j.result["projected_s"] for j in known}
        deps = {j.id: [d for d in j.deps if d in durations] for j in known}
        makespan, times = schedule(durations, deps, {j.id: j.pool for j in known}, caps)
        longest = max(bottom_levels(durations, deps).values())
        out["schedule"] = {
            "max_parallel": caps,
            "makespan_s": makespan,
            "critical_path_s": longest,
            "start_end_s": {j: [round(a, 1), round(b, 1)] for j, (a, b) in times.items()},
        }
    return out


def print_report(jobs: list[Job], tot: dict, overrides: dict) -> None:
    print(
        f"\n{'stage':9} {'model':11} {'fold':>4} {'device':6} {'wall s':>8} {'projected s':>12} {'factor':>7} "
        f"{'GPU util mean/max %':>20} {'GPU MiB':>8}  note"
    )
    for j in jobs:
        r = j.result
        wall = f"{r['wall_s']:.1f}" if "wall_s" in r else "-"
        proj = f"{r['projected_s']:.1f}{'*' if r.get('projected') else ''}" if "projected_s" in r else "-"
        factor = f"{r['factor']:.2f}" if r.get("factor") else "-"
        gpu = r.get("gpu") or {}
        util = f"{gpu['util_mean']}/{gpu['util_max']}" if gpu.get("util_mean") is not None else "-"
        mem = f"{gpu['mem_max_mib']:.0f}" if gpu.get("mem_max_mib") is not None else "-"
        note = (r.get("error") or r.get("basis") or ("not run" if not j.run else "")).splitlines()[0]
        fold = "" if j.fold is None else str(j.fold)
        print(
            f"{j.stage:9} {j.model or '':11} {fold:>4} {j.device:6} {wall:>8} {proj:>12} {factor:>7} {util:>20} "
            f"{mem:>8}  {note}"
        )
    mark = " (projected)" if tot["projected"] else ""
    print(
        "\n* projected to the seed's numbers (linear in epochs / trials / checkpoints; an upper bound where early "
        "stopping would end a run sooner)"
    )
    print(
        f"GPU-hours {tot['gpu_hours']:.3f}{mark}, CPU pod-hours {tot['cpu_hours']:.3f}{mark}, "
        f"EUR {tot['eur']:.2f}{mark} (EUR {tot['eur_per_gpu_hour']}/GPU-h, {tot['eur_per_cpu_hour']}/CPU-pod-h)"
    )
    print(
        f"measured in this run: {tot['measured_this_run']['gpu_hours']:.3f} GPU-h, "
        f"{tot['measured_this_run']['cpu_hours']:.3f} CPU-pod-h"
    )
    print(
        f"the original system: {SPEC_COST_ROW['gpu_hours']:.1f} GPU-h, EUR {SPEC_COST_ROW['eur']:.0f}, "
        f"{SPEC_COST_ROW['wall']} ({SPEC_COST_ROW['source']})"
    )
    if "schedule" in tot:
        s = tot["schedule"]
        print(
            f"wall time with {s['max_parallel']['gpu']} GPU + {s['max_parallel']['cpu']} CPU pods: "
            f"{s['makespan_s'] / 60:.1f} min{mark} (critical path {s['critical_path_s'] / 60:.1f} min)"
        )
    if overrides:
        print(f"NOT at the seed's sizes: --set {overrides}")
    if not tot["complete"]:
        print(f"INCOMPLETE: no figure for {', '.join(tot['missing_jobs'])}: the totals leave them out")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-dir", type=Path, help="the symbol's folder (DATA/ES.FUT) holding mbp-10/ and ohlcv-1m/")
    p.add_argument("--predecoded-dir", type=Path, help="its sidecar cache (default: bench/out/pd/SYMBOL, built where missing)")
    p.add_argument(
        "--work-dir", type=Path, default=Path("bench/out/ensemble"), help="checkpoints, hyperopt results, logs (emptied first)"
    )
    p.add_argument("--out", type=Path, default=Path("bench/out/bench_ensemble.json"))
    p.add_argument("--epochs", type=int, help="training epochs per fold of the registry members (seed: 50)")
    p.add_argument("--flagship-epochs", type=int, help="the flagship's epochs per fold (seed: 5, run in full by default)")
    p.add_argument("--trials", type=int, help="PSO trials per searchable model (seed: 20)")
    p.add_argument(
        "--trial-epochs",
        type=int,
        help="epochs per hyperopt trial, every searchable model (seed: 10 for RL, the search's default for supervised)",
    )
    p.add_argument("--folds", help="folds to run, e.g. 0 (default: all); the others are projected from them")
    p.add_argument(
        "--n-folds",
        type=int,
        default=repo_default("alpha_core/data/folds.py", "N_FOLDS"),
        help="walk-forward folds (default: the pipeline's N_FOLDS)",
    )
    p.add_argument("--cv-train-window", type=int, default=0, help="files per training window (0: the plan's default)")
    p.add_argument("--allow-untested-folds", action="store_true", help="let a fold have no test file (few files)")
    p.add_argument(
        "--jobs", help="only these jobs: comma-separated model names or id patterns (hyperopt/*, train/kan/0, evaluate)"
    )
    p.add_argument(
        "--device-of",
        action="append",
        default=[],
        metavar="MODEL=DEV",
        help="override a job's device (MODEL, `evaluate` or `all`), e.g. all=cpu",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a trainer/search setting wherever it exists (n_train_seqs=512): no longer the seed's "
        "sizes, and the report says so",
    )
    p.add_argument("--pod-cores", type=int, help="CPU cores each job may use (default: all of this machine's)")
    p.add_argument(
        "--max-parallel",
        type=int,
        default=repo_default("alpha_assets/run.py", "MAX_PARALLEL"),
        help="GPU pods at once (default: the repo's MAX_PARALLEL)",
    )
    p.add_argument(
        "--max-parallel-cpu", type=int, help="CPU pods at once (default: --max-parallel, the deploy's pool default_limit)"
    )
    p.add_argument("--eur-per-gpu-hour", type=float, default=repo_default("alpha_assets/asset_configs.py", "eur_per_gpu_hour"))
    p.add_argument(
        "--eur-per-cpu-hour",
        type=float,
        default=EUR_PER_CPU_HOUR,
        help=f"EUR per CPU-pod hour (default {EUR_PER_CPU_HOUR}: an assumption, not in the original system)",
    )
    p.add_argument("--stop-after", type=float, help="start no job after this many seconds (the rest: not run)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def scale_of(job: Job, seed: dict, run: dict, folds_run: list[int]) -> str:
    """What a job will run against the seed's numbers (the plan's column)."""
    if job.stage == "hyperopt":
        return (
            f"{run['trials']}/{seed['trials']} trials x "
            f"{run['trial_epochs'][job.trainer]}/{seed['trial_epochs'][job.trainer]} epochs"
        )
    if job.skipped == "--jobs":
        return "not selected (--jobs): no figure"
    if job.skipped == "--folds":
        return f"projected from fold(s) {','.join(map(str, folds_run))}"
    if job.stage == "train":
        key = "flagship_epochs" if job.model == "perception" else "epochs"
        return f"{run[key]}/{seed[key]} epochs"
    return "every checkpoint present"


def parse_sets(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(*args.child)
    from alpha_core.hyperopt.pso import HyperoptConfig
    from alpha_core.models import registry
    from alpha_core.train.perception import TrainConfig
    from alpha_core.train.walk_forward import WalkForwardConfig

    specs = registry.REGISTRY
    seed = {
        "epochs": WalkForwardConfig.model_fields["epochs"].default,  # the original system's EPOCHS
        "flagship_epochs": TrainConfig.model_fields["epochs"].default,
        "trials": HyperoptConfig.model_fields["trials"].default,  # the original system's HYPEROPT_TRIALS
        "trial_epochs": {
            "rl": 10,  # the original system's `hyperopt_baseline_rl --epochs 10`
            "supervised": HyperoptConfig.model_fields["epochs"].default,
        },
        "folds": repo_default("alpha_core/data/folds.py", "N_FOLDS"),
    }
    run = {
        "epochs": args.epochs or seed["epochs"],
        "flagship_epochs": args.flagship_epochs or seed["flagship_epochs"],
        "trials": args.trials or seed["trials"],
        "trial_epochs": {k: args.trial_epochs or v for k, v in seed["trial_epochs"].items()},
    }
    for name in ("epochs", "flagship_epochs", "trials", "trial_epochs", "pod_cores", "max_parallel", "n_folds"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
    folds_run = sorted({int(k) for k in args.folds.split(",")}) if args.folds else list(range(args.n_folds))
    if not set(folds_run) <= set(range(args.n_folds)):
        raise SystemExit(f"--folds {args.folds}: folds are 0-{args.n_folds - 1}")
    devices = device_table(specs, args.device_of)
    patterns = [p.strip() for p in args.jobs.split(",") if p.strip()] if args.jobs else None
    jobs = plan_jobs(specs, devices, args.n_folds, folds_run, patterns)
    caps = {"gpu": args.max_parallel, "cpu": args.max_parallel_cpu or args.max_parallel}
    overrides = parse_sets(args.set)
    print(f"seed: {seed}\nthis run: {run}, folds {folds_run}, overrides {overrides or 'none'}, pods {caps}")
    for job in jobs:
        print(
            f"  {'run ' if job.run else 'skip'} {job.id:22} {job.device:6} {scale_of(job, seed, run, folds_run):34} "
            f"after {'every train job' if job.stage == 'evaluate' else ', '.join(job.deps) or '-'}"
        )
    if args.dry_run:
        return 0
    if args.data_dir is None:
        raise SystemExit("--data-dir is required (the symbol's folder, e.g. data/demo/ES.FUT)")
    if any(j.run and j.pool == "gpu" for j in jobs) and not shutil.which("nvidia-smi"):
        raise SystemExit("jobs are placed on cuda but this machine has no nvidia-smi: pass --device-of all=cpu")

    from alpha_core.errors import DataError, PlanError

    symbol, work = args.data_dir.resolve().name, args.work_dir.resolve()
    pd = (args.predecoded_dir or Path("bench/out/pd") / symbol).resolve()
    try:
        check_data(args, symbol, pd)
    except (DataError, PlanError) as exc:
        raise SystemExit(f"--data-dir {args.data_dir}: {exc}") from None
    if work.exists() and any(work.iterdir()) and not (work / MARKER).exists():
        raise SystemExit(f"--work-dir {work} is not empty and not a previous bench's: choose another")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / MARKER).touch()
    base = {
        "work": str(work),
        "data_dir": str(args.data_dir.resolve()),
        "predecoded_dir": str(pd),
        "symbol": symbol,
        "n_folds": args.n_folds,
        "cv_train_window": args.cv_train_window,
        "allow_untested_folds": args.allow_untested_folds,
        "overrides": overrides,
    }
    hyper_out = {j.model: work / "hyperopt" / j.model / symbol / "results.json" for j in jobs if j.stage == "hyperopt"}
    report = {
        "machine": machine(),
        "seed": seed,
        "run": run
        | {
            "folds": folds_run,
            "n_folds": args.n_folds,
            "cv_train_window": args.cv_train_window,
            "allow_untested_folds": args.allow_untested_folds,
            "pod_cores": args.pod_cores,
        },
        "overrides": overrides,
        "at_seed_sizes": not overrides,
        "device_of": devices,
        "spec_cost": SPEC_COST_ROW,
        "notes": NOTES,
    }
    began = time.perf_counter()
    for job in jobs:
        if not job.run:
            continue
        if args.stop_after and time.perf_counter() - began > args.stop_after:
            job.run, job.result = False, {"error": f"not started: --stop-after {args.stop_after:g} s"}
            continue
        spec = base | {"stage": job.stage, "model": job.model, "fold": job.fold, "device": job.device}
        if job.stage == "train":
            spec |= {
                "epochs": run["flagship_epochs"] if job.model == "perception" else run["epochs"],
                "params_file": str(hyper_out[job.model]) if job.model in hyper_out else None,
            }
        elif job.stage == "hyperopt":
            spec |= {"trials": run["trials"], "epochs": run["trial_epochs"][job.trainer], "output": str(hyper_out[job.model])}
        else:
            spec["hyperopt_results"] = {m: str(p) for m, p in hyper_out.items() if p.exists()}
        print(f"{job.id} on {job.device} ...", flush=True)
        job.result = run_job(job, spec, work, args.pod_cores)
        if job.stage == "evaluate":
            job.result["checkpoints"] = len(list((work / "models").glob(f"*/{symbol}/fold-*")))
        r = job.result
        print(f"  {r['wall_s']:.1f} s, rc {r['rc']}" + (f": {r['error']}" if r.get("error") else ""), flush=True)
        write(args.out, report, jobs, seed, run, args, caps)
    tot = write(args.out, report, jobs, seed, run, args, caps)
    print_report(jobs, tot, overrides)
    print(f"\nwritten: {args.out}")
    return 1 if any(j.result.get("rc") for j in jobs) else 0


def check_data(args: argparse.Namespace, symbol: str, pd: Path) -> None:
    """The sidecars (the data assets' work, not the ensemble's: built here, first) and the fold plan, whose
    errors are clearer now than in every job."""
    from alpha_core.data.dbn import MBP10, OHLCV_1M
    from alpha_core.data.folds import plan_folds
    from alpha_core.data.predecode import file_ref, predecode

    for schema in (MBP10, OHLCV_1M):
        refs = [file_ref(i.sidecar) for i in predecode(args.data_dir, pd, symbol, schema)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan_folds(refs, args.n_folds, args.cv_train_window, args.allow_untested_folds)
        for w in caught:
            print(f"note ({schema}): {w.message}")


def write(path: Path, report: dict, jobs: list[Job], seed: dict, run: dict, args, caps: dict) -> dict:
    """The JSON after every job, so that a call cut short still leaves what it measured."""
    fill_projections(jobs, seed, run)
    tot = totals(jobs, args.eur_per_gpu_hour, args.eur_per_cpu_hour, caps)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report | {"jobs": [asdict(j) for j in jobs], "totals": tot}, indent=1, default=str))
    return tot


def machine() -> dict:
    info = {"cores": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]}
    if shutil.which("nvidia-smi"):
        info["gpu"] = subprocess.run(
            ["nvidia-smi", "-i", "0", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    import torch

    return info | {"torch": torch.__version__}


if __name__ == "__main__":
    sys.exit(main())
