"""Evaluation time on CPU, `--scale small` demo data of ES.FUT, three walk-forward folds.

    .venv/bin/python bench/bench_evaluate.py [--out bench/out/evaluate] [--device cpu]
    .venv/bin/python bench/bench_evaluate.py --demo [--out bench/out/evaluate-demo] [--repeat 3] [--profile]
        [--reference REPORT.json]

Default: trains every registry model briefly (one epoch, small budgets: the benchmark times evaluation, not
training), laid out as models/<model>/ES.FUT/fold-<k>/, then times `alpha evaluate` over all of them.

--demo: the checkpoints `make demo` evaluates (perception, tft and ppo, 2 epochs at the Makefile's DEMO_TRAIN,
without its hyperopt), trained once into --out and reused by later runs; then `alpha evaluate` as its own process
(`--repeat` times: wall, CPU and the load average, since the VM's cores are shared), and with --profile once more
in-process under cProfile (its top functions). --reference compares the report with an earlier one (say, of the
code before a change): every number must be the same; only `created` and the Markdown's checksum (the Markdown
shows `created`) may differ.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from alpha_core.cli import main as alpha
from alpha_core.data.demo import generate_demo_data
from alpha_core.models import registry

FOLDS = ["--cv-n-folds", "3", "--cv-train-window", "2"]
ROOT = Path(__file__).resolve().parent.parent


# the time of evaluating every checkpoint, as before the CLI gated them: thresholds every finite one passes
EVERY_CHECKPOINT = ["--min-val-auc", "0", "--min-val-sharpe", "-1000"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--demo", action="store_true", help="the `make demo` checkpoints, evaluated as a process")
    parser.add_argument("--repeat", type=int, default=1, help="--demo: timed `alpha evaluate` runs")
    parser.add_argument("--profile", action="store_true", help="--demo: one more run in-process under cProfile")
    parser.add_argument("--reference", type=Path, help="--demo: a report the new one must equal, number for number")
    args = parser.parse_args()
    if args.demo:
        demo(args.out or Path("bench/out/evaluate-demo"), args)
    else:
        zoo(args.out or Path("bench/out/evaluate"), args.device)


def zoo(out: Path, device: str) -> None:
    torch.set_num_threads(1)
    shutil.rmtree(out, ignore_errors=True)
    data, models, pd = out / "data", out / "models", out / "pd"
    generate_demo_data(data, "small", 7, ["ES.FUT"])
    bars, book = data / "ES.FUT" / "ohlcv-1m", data / "ES.FUT" / "mbp-10"
    t0 = time.perf_counter()
    for name, spec in registry.REGISTRY.items():
        dest = models / name / "ES.FUT"
        if spec.trainer == "supervised":
            rc = alpha(
                [
                    "train-supervised",
                    "--model",
                    name,
                    "--data-dir",
                    str(bars),
                    "--output-dir",
                    str(dest),
                    "--epochs",
                    "1",
                    "--seq-len",
                    "32",
                    "--batch-size",
                    "128",
                    "--n-train-seqs",
                    "512",
                    "--n-val-seqs",
                    "256",
                    "--predecoded-dir",
                    str(pd),
                    "--device",
                    device,
                    *FOLDS,
                ]
            )
        elif spec.trainer == "rl":
            rc = alpha(
                [
                    "train-rl",
                    "--model",
                    name,
                    "--data-dir",
                    str(bars),
                    "--output-dir",
                    str(dest),
                    "--epochs",
                    "1",
                    "--timesteps-per-epoch",
                    "1024",
                    "--predecoded-dir",
                    str(pd),
                    "--device",
                    device,
                    *FOLDS,
                ]
            )
        else:
            rc = 0
            for k in range(3):
                rc |= alpha(
                    [
                        "train",
                        "--mbp10-data-dir",
                        str(book),
                        "--predecoded-dir",
                        str(pd),
                        "--out",
                        str(dest / f"fold-{k}"),
                        "--epochs",
                        "1",
                        "--batch-size",
                        "64",
                        "--n-train-seqs",
                        "256",
                        "--n-val-seqs",
                        "128",
                        "--seq-len",
                        "32",
                        "--device",
                        device,
                        "--cv-fold",
                        str(k),
                        *FOLDS,
                    ]
                )
        assert rc == 0, name
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert (
        alpha(
            [
                "evaluate",
                "--models-dir",
                str(models),
                "--data-dir",
                str(data),
                "--output",
                str(out / "eval" / "ensemble_report.json"),
                "--predecoded-dir",
                str(pd),
                "--device",
                device,
                *EVERY_CHECKPOINT,
            ]
        )
        == 0
    )
    eval_s = time.perf_counter() - t0
    result = {
        "models": len(registry.REGISTRY),
        "folds": 3,
        "scale": "small",
        "device": device,
        "threads": torch.get_num_threads(),
        "evaluate_seconds": eval_s,
        "training_seconds": train_s,
    }
    (out / "bench_evaluate.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def demo_train_config() -> dict:
    """The Makefile's DEMO_TRAIN, the training settings of `make demo`."""
    line = re.search(r"^DEMO_TRAIN := (.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    return json.loads(line.group(1))


def train_demo(out: Path) -> float:
    """perception, tft and ppo, every fold, as `make demo` trains them (without its hyperopt: default parameters)."""
    cfg, data, pd = demo_train_config(), out / "data", out / "pd" / "ES.FUT"
    sizes = [
        "--seq-len",
        str(cfg["seq_len"]),
        "--batch-size",
        str(cfg["batch_size"]),
        "--n-train-seqs",
        str(cfg["n_train_seqs"]),
        "--n-val-seqs",
        str(cfg["n_val_seqs"]),
        "--device",
        cfg["device"],
    ]
    common = ["--epochs", "2", "--predecoded-dir", str(pd), *FOLDS, "--allow-untested-folds"]
    t0 = time.perf_counter()
    for k in range(3):
        assert (
            alpha(
                [
                    "train",
                    "--mbp10-data-dir",
                    str(data / "ES.FUT" / "mbp-10"),
                    "--out",
                    str(out / "models" / "perception" / "ES.FUT" / f"fold-{k}"),
                    "--cv-fold",
                    str(k),
                    *sizes,
                    *common,
                ]
            )
            == 0
        )
    assert (
        alpha(
            [
                "train-supervised",
                "--model",
                "tft",
                "--data-dir",
                str(data / "ES.FUT"),
                "--symbol",
                "ES.FUT",
                "--output-dir",
                str(out / "models" / "tft" / "ES.FUT"),
                *sizes,
                *common,
            ]
        )
        == 0
    )
    assert (
        alpha(
            [
                "train-rl",
                "--model",
                "ppo",
                "--data-dir",
                str(data / "ES.FUT"),
                "--symbol",
                "ES.FUT",
                "--output-dir",
                str(out / "models" / "ppo" / "ES.FUT"),
                "--timesteps-per-epoch",
                str(cfg["timesteps_per_epoch"]),
                "--device",
                cfg["device"],
                *common,
            ]
        )
        == 0
    )
    return time.perf_counter() - t0


def evaluate_args(out: Path, report: Path) -> list[str]:
    return [
        "--quiet",
        "evaluate",
        "--models-dir",
        str(out / "models"),
        "--data-dir",
        str(out / "data"),
        "--predecoded-dir",
        str(out / "pd"),
        "--device",
        "cpu",
        "--output",
        str(report),
        *EVERY_CHECKPOINT,
    ]


def timed_process(args: list[str]) -> dict:
    """`alpha ARGS` as its own process, as a user runs it: wall and CPU seconds, load average before and after."""
    before, load = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("alpha")), *args], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wall_s": round(wall, 2),
        "user_s": round(after.ru_utime - before.ru_utime, 2),
        "sys_s": round(after.ru_stime - before.ru_stime, 2),
        "load_before": load,
        "load_after": os.getloadavg()[0],
    }


def profile(args: list[str], top: int = 25) -> str:
    """The in-process run's functions by cumulative time (the main thread's view: inference on worker threads
    shows as the time `_window_probs` waits for them)."""
    prof = cProfile.Profile()
    prof.runcall(alpha, args)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(r"alpha_core|matplotlib|stable_baselines3", top)
    return buf.getvalue()


def same_report(new: Path, reference: Path) -> list[str]:
    """The keys whose values differ between two reports, other than `created` and the Markdown's checksum."""
    a, b = (json.loads(p.read_text()) for p in (new, reference))
    for r in (a, b):
        r.pop("created")
        r["files"].pop("ensemble_report.md")
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def demo(out: Path, args: argparse.Namespace) -> None:
    if not (out / "data").exists():
        generate_demo_data(out / "data", "small", 7, ["ES.FUT"])
    n_ckpts = len(list((out / "models").glob("*/ES.FUT/fold-*")))
    train_s = train_demo(out) if n_ckpts < 9 else None  # reused: training is not what this times
    report = out / "eval" / "ensemble_report.json"
    runs = [timed_process(evaluate_args(out, report)) for _ in range(args.repeat)]
    result = {
        "checkpoints": "perception, tft, ppo x 3 folds (make demo's DEMO_TRAIN, 2 epochs, no hyperopt)",
        "cpu_cores": len(os.sched_getaffinity(0)),
        "training_seconds": train_s,
        "runs": runs,
        "best_wall_s": min(r["wall_s"] for r in runs),
    }
    if args.reference:
        result["differs_from_reference"] = same_report(report, args.reference)
    if args.profile:
        print(profile(evaluate_args(out, out / "eval-profiled" / "ensemble_report.json")))
    (out / "bench_evaluate_demo.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
