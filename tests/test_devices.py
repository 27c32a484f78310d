"""GPU leases on a host with several GPUs: each step runs on a GPU of its own, sees only that one, a crashed step's
lease is taken over, and with one GPU nothing is leased. (The GPUs are named by CUDA_VISIBLE_DEVICES: the lease
logic needs no GPU; on a GPU machine the same code runs with real ones.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from alpha_core.devices import gpu_lease

STEP = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from alpha_core.devices import gpu_lease
    with gpu_lease(run="run-1", step=sys.argv[1], poll_s=0.1) as gpu:
        Path(sys.argv[2]).write_text(json.dumps({"gpu": gpu, "sees": os.environ["CUDA_VISIBLE_DEVICES"],
                                                 "start": time.time()}))
        time.sleep(float(sys.argv[3]))
    Path(sys.argv[2]).with_suffix(".done").write_text(str(time.time()))
""")


def _steps(tmp_path, gpus: str, n: int, hold_s: float) -> list[dict]:
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": gpus,
        "ALPHA_GPU_LEASE_DIR": str(tmp_path / "leases"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    procs = [
        subprocess.Popen([sys.executable, "-c", STEP, f"step-{i}", str(tmp_path / f"step-{i}.json"), str(hold_s)], env=env)
        for i in range(n)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * n
    return [
        json.loads((tmp_path / f"step-{i}.json").read_text()) | {"end": float((tmp_path / f"step-{i}.done").read_text())}
        for i in range(n)
    ]


def test_concurrent_steps_each_run_on_a_gpu_of_their_own(tmp_path):
    steps = _steps(tmp_path, "3,5", 3, hold_s=1.5)
    assert all(s["sees"] == s["gpu"] for s in steps)  # each step sees its leased GPU alone
    for a in steps:
        for b in steps:
            if a is not b and a["gpu"] == b["gpu"]:  # the same GPU: one after the other, never at once
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    assert {s["gpu"] for s in steps} == {"3", "5"}


def test_a_crashed_steps_lease_is_taken_over_and_one_gpu_needs_no_lease(tmp_path, monkeypatch):
    monkeypatch.setenv("ALPHA_GPU_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    crash = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import os, signal
        from alpha_core.devices import gpu_lease
        with gpu_lease(run="run-1", step="crashes"):
            os.kill(os.getpid(), signal.SIGKILL)
    """),
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert crash.returncode == -9 and len(list((tmp_path / "leases").glob("gpu-*.lock"))) == 1
    started = time.monotonic()
    with gpu_lease(run="run-2", step="a", wait_s=5) as gpu:
        assert gpu == "0" and os.environ["CUDA_VISIBLE_DEVICES"] == "0"  # the dead step's GPU, taken over at once
    assert time.monotonic() - started < 5 and os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with gpu_lease(run="run-3", step="c") as only:
        assert only == "7" and not list((tmp_path / "leases").glob("gpu-7.lock"))
