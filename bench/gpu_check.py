"""The GPU regression check's runner and report (bench/gpu_check.sh runs it on the device, after the set-up).

Runs each stage in its own process, under one deadline (a device call has 10 minutes), each with its output in one
log, then prints every figure against its target with PASS or FAIL and writes all of it to `--out`/gpu_check.json.
A stage that failed, timed out or found no time left gives FAIL with the reason. `--report-only` prints the
report again from a gpu_check.json. Targets: issue 22 (items 5 and 7), or where it names none, the last measured
figure (bench/README.md, "The GPU regression check") with a noise allowance, so that a regression shows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

PY = sys.executable
DATA, PD = "gpu/data/ES.FUT", "gpu/pd"
SUPERVISED = ["tft", "mamba2", "tggn", "tlob", "liquid", "kan", "xlstm", "diffusion"]  # registry order
B4096_FP32_LAST = 394_086  # seq/s, measured 2026-12-02 (6eb6eeb, bench/results/h200-2026-12-02b); before: 333,096
ENSEMBLE_FOLD_LAST_S = 64.6  # measured 2026-12-02 (c769f39, bench/results/h200-2026-12-02b); before the fused Liquid: 136


def stage_commands(raw: Path) -> list[tuple[str, float, list[str], dict]]:
    """(name, time limit in seconds, argv, extra environment), in the order they run."""
    train = [PY, "bench/bench_train_gpu.py", "--data-dir", f"{DATA}/mbp-10", "--predecoded-dir", PD, "--skip-inference"]
    cold = Path("/tmp/gpu_check_cold")
    shutil.rmtree(cold, ignore_errors=True)
    ensemble = [
        PY,
        "bench/bench_ensemble.py",
        "--data-dir",
        DATA,
        "--predecoded-dir",
        PD,
        "--cv-train-window",
        "1",
        "--allow-untested-folds",
        "--folds",
        "0",
    ]
    # the files holding CUDA tests (collecting all of tests/ would import Dagster, which the device lacks)
    cuda_files = [str(f) for f in sorted(Path("tests").glob("test_*.py")) if "mark.cuda" in f.read_text()]
    return [
        (
            "cuda_tests",
            240,
            [PY, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *cuda_files],
            {"ALPHA_GPU_TEST_DATA": "gpu"},
        ),
        (
            "ensemble_fold",
            200,
            [
                *ensemble,
                "--jobs",
                ",".join(f"train/{m}/0" for m in SUPERVISED),
                "--work-dir",
                "/tmp/gpu_check_ensemble",
                "--out",
                str(raw / "ensemble_fold.json"),
            ],
            {},
        ),
        (
            "dqn_fold",
            150,
            [*ensemble, "--jobs", "train/dqn/0", "--work-dir", "/tmp/gpu_check_dqn", "--out", str(raw / "dqn_fold.json")],
            {},
        ),
        ("b1_fp32", 110, [*train, "--modes", "1:fp32:1:c", "--steps", "1000", "--out", str(raw / "b1_fp32.json")], {}),
        ("b4096_bf16", 120, [*train, "--modes", "4096:bf16:1:c", "--steps", "100", "--out", str(raw / "b4096_bf16.json")], {}),
        ("b4096_fp32", 120, [*train, "--modes", "4096:fp32:1:c", "--steps", "100", "--out", str(raw / "b4096_fp32.json")], {}),
        (
            "fold_cold",
            110,
            [
                PY,
                "bench/fold_timeline.py",
                "--data-dir",
                f"{DATA}/mbp-10",
                "--predecoded-dir",
                PD,
                "--out",
                str(raw / "fold_cold.json"),
                "--work-dir",
                "/tmp/gpu_check_fold",
            ],
            {"TORCHINDUCTOR_CACHE_DIR": str(cold / "inductor"), "TRITON_CACHE_DIR": str(cold / "triton")},
        ),
        # a diagnostic, not a target (--stages): one DQN epoch and its parts at 16 torch threads (as before 4f8555d) and at 1
        (
            "dqn_threads",
            90,
            [
                PY,
                "bench/bench_dqn.py",
                "--data-dir",
                DATA,
                "--predecoded-dir",
                PD,
                "--threads",
                "16,1",
                "--out",
                str(raw / "dqn_threads.json"),
            ],
            {},
        ),
    ]


DEFAULT_STAGES = "cuda_tests,ensemble_fold,dqn_fold,b1_fp32,b4096_bf16,b4096_fp32,fold_cold"


def run_stages(out: Path, deadline: float, chosen: list[str]) -> dict:
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    stages = {}
    with (out / "gpu_check.log").open("w") as log:
        for name, limit, argv, env in stage_commands(raw):
            if name not in chosen:
                stages[name] = {"rc": None, "wall_s": 0.0, "error": "not run: not among --stages"}
                continue
            left = deadline - time.monotonic() - 5
            if left < 20:
                stages[name] = {"rc": None, "wall_s": 0.0, "error": "not run: the call's time was used up"}
                continue
            limit = min(limit, left)
            log.write(f"\n===== {name}: {' '.join(argv)} (limit {limit:.0f} s)\n")
            log.flush()
            print(f"{name} ...", flush=True)
            started = time.monotonic()
            try:
                done = subprocess.run(argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, timeout=limit)
                rc = done.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            stages[name] = {"rc": rc, "wall_s": round(time.monotonic() - started, 1), "limit_s": round(limit)}
            log.flush()
            print(f"  {stages[name]}", flush=True)
    with tarfile.open(out / "raw.tgz", "w:gz") as tar:  # the device hands back few files: one archive
        tar.add(raw, arcname="raw")
    shutil.rmtree(raw)
    return stages


def _raw(out: Path) -> dict[str, dict]:
    """The stages' JSON files from raw.tgz, by name."""
    found = {}
    if (out / "raw.tgz").exists():
        with tarfile.open(out / "raw.tgz") as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    with contextlib.suppress(json.JSONDecodeError, AttributeError):
                        found[Path(member.name).stem] = json.load(tar.extractfile(member))
    return found


def figures(out: Path, stages: dict) -> dict:
    """Each target's figure, read from the stages' outputs (None where a stage gave none, with why)."""
    raw = _raw(out)
    log = (out / "gpu_check.log").read_text() if (out / "gpu_check.log").exists() else ""
    fig: dict = {}
    tests = log.split("===== cuda_tests")[-1].split("\n===== ")[0] if "===== cuda_tests" in log else ""
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", tests)}
    fig["cuda_tests"] = {
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0),
        "skipped": counts.get("skipped", 0),
        "failures": re.findall(r"^(?:FAILED|ERROR) (\S+)", tests, re.M),
    }
    for key in ("b1_fp32", "b4096_bf16", "b4096_fp32"):
        modes = (raw.get(key) or {}).get("modes") or [{}]
        fig[key] = modes[0]
    fold = raw.get("fold_cold") or {}
    marks = dict(fold.get("marks", []))
    fig["fold_cold"] = {
        "fold_s": marks.get("fit done"),
        "epoch_s": fold.get("epoch_s"),
        "best_mean_auc": fold.get("best_mean_auc"),
        "first_step_s": marks.get("captured step, call 4"),
    }
    jobs = {
        j["id"]: j.get("result", {})
        for name in ("ensemble_fold", "dqn_fold")
        for j in (raw.get(name) or {}).get("jobs", [])
        if j.get("run")
    }
    per_model = {m: jobs.get(f"train/{m}/0", {}) for m in [*SUPERVISED, "dqn"]}
    fig["ensemble"] = {
        m: {
            k: r.get(k)
            for k in ("wall_s", "epochs_run", "early_stopped", "best_mean_auc", "val_sharpe", "device_used", "rc", "error")
        }
        for m, r in per_model.items()
    }
    for r in fig["ensemble"].values():  # a job that failed has no figure
        if r["rc"] != 0 or r["error"]:
            r["failed_wall_s"], r["wall_s"] = r["wall_s"], None
    fig["dqn_threads"] = (raw.get("dqn_threads") or {}).get("rows")
    return fig


def _fmt(v, unit: str) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f} {unit}" if unit == "seq/s" else f"{v:.1f} {unit}"


def verdicts(fig: dict, stages: dict) -> list[dict]:
    """One row per target: the figure, the target, PASS or FAIL (and why where there is no figure)."""

    def stage_note(name: str) -> str:
        s = stages.get(name, {})
        return s.get("error") or ("" if s.get("rc") == 0 else f"stage {name} rc {s.get('rc')}")

    rows = []
    t = fig["cuda_tests"]
    ok = stages.get("cuda_tests", {}).get("rc") == 0 and t["failed"] == 0 and t["passed"] > 0
    rows.append(
        {
            "target": "CUDA test set (pytest -m cuda)",
            "figure": f"{t['passed']} passed, {t['failed']} failed",
            "goal": "all pass",
            "pass": ok,
            "note": ", ".join(t["failures"][:6]) or stage_note("cuda_tests"),
        }
    )

    def row(label: str, value, unit: str, op: str, goal: float, source: str, stage: str, why: str | None = None) -> None:
        passed = value is not None and (value >= goal if op == ">=" else value < goal if op == "<" else value <= goal)
        goal_text = f"{op} {goal:,.0f}" if unit == "seq/s" else f"{op} {goal:g} s"
        note = source if value is not None else why or stage_note(stage) or "no figure"
        rows.append(
            {
                "target": label,
                "figure": _fmt(value, unit),
                "value": value,
                "goal": goal_text,
                "pass": passed,
                "note": note[:200],
            }
        )

    row(
        "flagship B=1 fp32, compile + CUDA graph",
        fig["b1_fp32"].get("sequences_per_s"),
        "seq/s",
        ">=",
        3000,
        "issue 22 item 7",
        "b1_fp32",
    )
    row(
        "flagship B=4096 bf16, compile + CUDA graph",
        fig["b4096_bf16"].get("sequences_per_s"),
        "seq/s",
        ">=",
        550_000,
        "issue 22 item 7",
        "b4096_bf16",
    )
    row(
        "flagship B=4096 fp32, compile + CUDA graph",
        fig["b4096_fp32"].get("sequences_per_s"),
        "seq/s",
        ">=",
        round(B4096_FP32_LAST * 0.95),
        f"last measured {B4096_FP32_LAST:,}, less 5% noise",
        "b4096_fp32",
    )
    row("flagship fold at the defaults, cold caches", fig["fold_cold"]["fold_s"], "s", "<", 25, "issue 22 item 7", "fold_cold")
    ens = fig["ensemble"]
    row(
        "Liquid fold at the defaults (GPU)",
        ens["liquid"].get("wall_s"),
        "s",
        "<",
        20,
        "issue 22 item 5",
        "ensemble_fold",
        ens["liquid"].get("error"),
    )
    walls = [ens[m].get("wall_s") for m in SUPERVISED]
    total = sum(walls) if all(w is not None for w in walls) else None
    failed = [m for m in SUPERVISED if ens[m].get("error") or ens[m].get("rc") not in (0, None)]
    row(
        "ensemble fold: 8 supervised members at the defaults (GPU), summed",
        total,
        "s",
        "<=",
        round(ENSEMBLE_FOLD_LAST_S * 1.1, 1),
        f"last measured {ENSEMBLE_FOLD_LAST_S:g} s, plus 10% noise",
        "ensemble_fold",
        f"failed: {', '.join(failed)}" if failed else None,
    )
    row(
        "DQN fold at the defaults, 16 CPU cores",
        ens["dqn"].get("wall_s"),
        "s",
        "<",
        45,
        "issue 22 item 5",
        "dqn_fold",
        ens["dqn"].get("error"),
    )
    return rows


def report(result: dict) -> None:
    print(f"\nGPU check ({result.get('commit', '?')}, {result.get('device', '?')}), {result.get('wall_s', 0):.0f} s in all")
    print(f"{'target':66} {'figure':>22} {'goal':>14}  result  note")
    for r in result["targets"]:
        print(f"{r['target']:66} {r['figure']:>22} {r['goal']:>14}  {'PASS' if r['pass'] else 'FAIL':6}  {r['note']}")
    per = "  ".join(f"{m} {v['wall_s']:.1f}" for m, v in result["figures"]["ensemble"].items() if v.get("wall_s"))
    print(f"per fold, s: {per}")
    for name, s in result["stages"].items():
        print(f"stage {name}: rc {s.get('rc')}, {s.get('wall_s')} s{(' ' + s['error']) if s.get('error') else ''}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/out/gpu_check")))
    p.add_argument("--deadline-s", type=float, default=560, help="seconds from now by which every stage has ended")
    p.add_argument(
        "--stages", default=DEFAULT_STAGES, help=f"comma-separated (default: {DEFAULT_STAGES}; dqn_threads: a diagnostic)"
    )
    p.add_argument("--report-only", type=Path, help="print the report of this gpu_check.json")
    args = p.parse_args()
    if args.report_only:
        report(json.loads(args.report_only.read_text()))
        return 0
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    stages = run_stages(args.out, started + args.deadline_s, args.stages.split(","))
    fig = figures(args.out, stages)
    device = subprocess.run(
        [PY, "-c", "import torch; print(torch.cuda.get_device_name(), torch.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "commit": os.environ.get("GPU_CHECK_COMMIT", "?"),
        "device": device,
        "cores": os.cpu_count(),
        "wall_s": time.monotonic() - started,
        "stages": stages,
        "figures": fig,
    }
    result["targets"] = verdicts(fig, stages)
    result["all_pass"] = all(r["pass"] for r in result["targets"])
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    report(result)
    return 0 if result["all_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
