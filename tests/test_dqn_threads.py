"""DQN on a CPU trains with one torch thread whatever CPUs its step was given (its networks are too small to share,
bench/bench_dqn.py); PPO keeps the step's threads. Every door (CLI, Dagster, hyperopt) trains through `train_rl`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # Dagster runs, killed processes or a browser: `make check` leaves them out

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to tell one thread from the step's")
@pytest.mark.parametrize("model,threads", [("dqn", "one"), ("ppo", "all")])
def test_dqn_trains_on_one_thread(tiny_data, tmp_path, model, threads):
    child = textwrap.dedent(f"""
        import json, os, sys
        import torch
        from alpha_core.cli import main
        from alpha_core.train import rl
        seen = {{}}
        fold = rl._train_fold
        def spy(*args, **kwargs):
            seen["intra"] = torch.get_num_threads()
            return fold(*args, **kwargs)
        rl._train_fold = spy
        rc = main(["train-rl", "--model", "{model}", "--epochs", "1", "--data-dir", sys.argv[1], "--output-dir",
                   sys.argv[2], "--cv-fold", "0", "--timesteps-per-epoch", "256", "--device", "cpu", "--quiet"])
        print(json.dumps({{"rc": rc, "cpus": len(os.sched_getaffinity(0)), **seen}}))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ALPHA_CPUS_PER_STEP")}
    out = subprocess.run(
        [sys.executable, "-c", child, str(tiny_data / "ES.FUT"), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["rc"] == 0, seen
    assert seen["intra"] == (1 if threads == "one" else seen["cpus"]), seen
