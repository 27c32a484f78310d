"""Evaluation time for every registry model of one symbol, three folds, `--scale small` demo data, on CPU.

    .venv/bin/python bench/bench_evaluate.py [--out bench/out/evaluate] [--device cpu]

It first trains every model briefly (one epoch, small budgets: the benchmark times evaluation, not
training), laid out as models/<model>/ES.FUT/fold-<k>/, then times `alpha evaluate` over all of them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from alpha_core.cli import main as alpha
from alpha_core.data.demo import generate_demo_data
from alpha_core.models import registry

FOLDS = ["--cv-n-folds", "3", "--cv-train-window", "2"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("bench/out/evaluate"))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    shutil.rmtree(args.out, ignore_errors=True)
    data, models, pd = args.out / "data", args.out / "models", args.out / "pd"
    generate_demo_data(data, "small", 7, ["ES.FUT"])
    bars, book = data / "ES.FUT" / "ohlcv-1m", data / "ES.FUT" / "mbp-10"
    t0 = time.perf_counter()
    for name, spec in registry.REGISTRY.items():
        out = models / name / "ES.FUT"
        if spec.trainer == "supervised":
            rc = alpha(["train-supervised", "--model", name, "--data-dir", str(bars), "--output-dir", str(out),
                        "--epochs", "1", "--seq-len", "32", "--batch-size", "128", "--n-train-seqs", "512",
                        "--n-val-seqs", "256", "--predecoded-dir", str(pd), "--device", args.device, *FOLDS])
        elif spec.trainer == "rl":
            rc = alpha(["train-rl", "--model", name, "--data-dir", str(bars), "--output-dir", str(out), "--epochs", "1",
                        "--timesteps-per-epoch", "1024", "--predecoded-dir", str(pd), "--device", args.device, *FOLDS])
        else:
            rc = 0
            for k in range(3):
                rc |= alpha(["train", "--mbp10-data-dir", str(book), "--predecoded-dir", str(pd), "--out",
                             str(out / f"fold-{k}"), "--epochs", "1", "--batch-size", "64", "--n-train-seqs", "256",
                             "--n-val-seqs", "128", "--seq-len", "32", "--device", args.device, "--cv-fold", str(k),
                             *FOLDS])
        assert rc == 0, name
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert alpha(["evaluate", "--models-dir", str(models), "--data-dir", str(data), "--output",
                  str(args.out / "eval" / "ensemble_report.json"), "--predecoded-dir", str(pd), "--device", args.device]) == 0
    eval_s = time.perf_counter() - t0
    result = {"models": len(registry.REGISTRY), "folds": 3, "scale": "small", "device": args.device, "threads": 1,
              "evaluate_seconds": eval_s, "training_seconds": train_s}
    (args.out / "bench_evaluate.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
