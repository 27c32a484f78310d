"""The GPU regression check's runner and report (bench/gpu_check.sh runs it on the device, after the set-up).

Runs each stage in its own process, under one deadline (a device call has 10 minutes), each with its output in one
log, then judges every figure twice: against its goal (issue 33), and against the last figure recorded in the
repository for the same card (bench/results/<gpu>-<date>/gpu_check*.json) with the target's noise band (`TARGETS`);
a time's CPU-bound seconds are first scaled to this host by the two hosts' CPU probes (`Target.on_this_host`).
Exit status 1 (a FAIL blocks, issue 33 item 6) when a figure regressed beyond its band, a figure is missing (a stage
failed, timed out or found no time left) or a CUDA test failed; a goal not yet met is reported, not blocking. A
figure that regressed is measured again first, where its stage can run twice (`CONFIRMABLE`), and the better run is
judged: a regression of the code repeats, a busy or slow host's often does not (bench/README.md, "The twelfth
check").
Everything goes to `--out`/gpu_check.json, written atomically: commit it as `record_as` says, and the next check on
that card compares with it (a blocked check's `record_as` is a `blocked_check_*.json` that no check compares with).
`--report-only` prints a gpu_check.json's report again; `--judge` judges one again against the records, in place.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

PY = sys.executable
DATA, PD = "gpu/data/ES.FUT", "gpu/pd"
SUPERVISED = ["tft", "mamba2", "tggn", "tlob", "liquid", "kan", "xlstm", "diffusion"]  # registry order


PODS = Path("/tmp/gpu_check_pods")  # the two pods' compile cache root, empty before the first
MEMBER_PODS = Path("/tmp/gpu_check_member_pods")  # the members' folds', filled by their warm-up
# a figure that regressed is measured once more before it blocks, where its stage can simply run again (the two
# pods need an empty compile cache, and the CUDA tests are not a timing)
CONFIRMABLE = ("ensemble_fold", "dqn_fold", "b1_fp32", "b4096_bf16", "b4096_fp32")


def empty_caches() -> None:
    """Start the check with no compile cache: the first pod's fold is cold, the members' warm-up fills theirs."""
    for folder in (PODS, MEMBER_PODS):
        shutil.rmtree(folder, ignore_errors=True)


def stage_commands(raw: Path) -> list[tuple[str, float, list[str], dict]]:
    """(name, time limit in seconds, argv, extra environment), in the order they run."""
    train = [PY, "bench/bench_train_gpu.py", "--data-dir", f"{DATA}/mbp-10", "--predecoded-dir", PD, "--skip-inference"]
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
        # untimed: one epoch of each member's fold 0, so that the timed folds start as a run's later pods do, from
        # the compile cache on the output volume (liquid's and xlstm's Triton kernels) and with the libraries read;
        # on a fresh machine a first fold paid up to 3.7 s more for these, and four checks read it as a regression
        (
            "members_warmup",
            120,
            [
                *ensemble,
                "--jobs",
                ",".join(f"train/{m}/0" for m in SUPERVISED),
                "--epochs",
                "1",
                "--work-dir",
                "/tmp/gpu_check_members_warmup",
                "--out",
                str(raw / "members_warmup.json"),
            ],
            {"ALPHA_COMPILE_CACHE": str(MEMBER_PODS)},
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
            {"ALPHA_COMPILE_CACHE": str(MEMBER_PODS)},
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
        # "two pods": the flagship fold at the defaults twice, each a fresh process, with one compile cache root
        # that starts empty (ALPHA_COMPILE_CACHE, alpha_core/compile_cache.py): the first pays every compilation,
        # the second starts from what the first left, as the second pod of a run does on the output volume
        *[
            (
                name,
                110,
                [
                    PY,
                    "bench/fold_timeline.py",
                    "--data-dir",
                    f"{DATA}/mbp-10",
                    "--predecoded-dir",
                    PD,
                    "--out",
                    str(raw / f"{name}.json"),
                    "--work-dir",
                    f"/tmp/gpu_check_{name}",
                ],
                {
                    "ALPHA_COMPILE_CACHE": str(PODS),
                    "TORCHINDUCTOR_CACHE_DIR": str(PODS / "inductor"),
                    "TRITON_CACHE_DIR": str(PODS / "triton"),
                },
            )
            for name in ("fold_cold", "fold_warm")
        ],
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


DEFAULT_STAGES = "cuda_tests,members_warmup,ensemble_fold,dqn_fold,b1_fp32,b4096_bf16,b4096_fp32,fold_cold,fold_warm"


STAGE_DONE = "----- done"  # the log line after each stage: its rc and seconds


def run_stages(out: Path, deadline: float, chosen: list[str], header: dict | None = None) -> dict:
    """Run the chosen stages into `out`; the log starts with `header` (the check's commit, card, torch and date) and
    the chosen stages, so that a check killed mid-way can still be judged from it (`judge_outputs`)."""
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    stages = {}
    with (out / "gpu_check.log").open("w") as log:
        log.writelines(f"{key}: {value}\n" for key, value in {**(header or {}), "stages": ",".join(chosen)}.items())
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
            log.write(f"{STAGE_DONE} {name}: {json.dumps(stages[name])}\n")  # what --judge-outputs reads after a kill
            log.flush()
            print(f"  {stages[name]}", flush=True)
    with tarfile.open(out / "raw.tgz", "w:gz") as tar:  # the device hands back few files: one archive
        tar.add(raw, arcname="raw")
    shutil.rmtree(raw)
    return stages


def _raw(out: Path) -> dict[str, dict]:
    """The stages' JSON files by name: from raw.tgz, and from raw/ where a check killed before its archive left them."""
    found = {}
    if (out / "raw.tgz").exists():
        with tarfile.open(out / "raw.tgz") as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    with contextlib.suppress(json.JSONDecodeError, AttributeError):
                        found[Path(member.name).stem] = json.load(tar.extractfile(member))
    for path in sorted((out / "raw").glob("*.json")):
        with contextlib.suppress(json.JSONDecodeError, OSError):
            found[path.stem] = json.loads(path.read_text())
    return found


def log_header(log: str) -> dict[str, str]:
    """The `key: value` lines `run_stages` writes before the first stage."""
    return dict(re.findall(r"^(\w+): (.*)$", log.split("\n=====")[0], re.M))


def stages_from_log(log: str) -> dict:
    """The stages of a check that was killed (its call's time or budget ran out), from its gpu_check.log: each
    finished stage's outcome, the one it was killed in, and those it never started, each with why."""
    chosen = log_header(log).get("stages", DEFAULT_STAGES).split(",")
    stages = {
        name: {"rc": None, "wall_s": 0.0, "error": "not run: the check was cut short before it"}
        if name in chosen
        else {"rc": None, "wall_s": 0.0, "error": "not run: not among --stages"}
        for name in DEFAULT_STAGES.split(",")
    }
    for name in re.findall(r"^===== (\w+): ", log, re.M):
        stages[name] = {"rc": "killed", "wall_s": None, "error": f"cut short: the check was killed during {name}"}
    for name, outcome in re.findall(rf"^{STAGE_DONE} (\w+): (.*)$", log, re.M):
        stages[name] = json.loads(outcome)
    return stages


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
    for key in ("fold_cold", "fold_warm"):  # the two pods: one flagship fold each, the same compile cache root
        fold = raw.get(key) or {}
        marks = dict(fold.get("marks", []))
        fig[key] = {
            "fold_s": marks.get("fit done"),
            "epoch_s": fold.get("epoch_s"),
            "best_mean_auc": fold.get("best_mean_auc"),
            "first_step_s": marks.get("captured step, call 4"),
            "compile_cache": fold.get("compile_cache"),
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
    # seconds per stage of each fold run (the trainers' summaries, `stage_s`): where a fold's time went
    fig["stage_s"] = {
        **{f"flagship {k.removeprefix('fold_')}": (raw.get(k) or {}).get("stage_s") for k in ("fold_cold", "fold_warm")},
        **{m: r.get("stage_s") for m, r in per_model.items()},
    }
    fig["stage_s"] = {k: v for k, v in fig["stage_s"].items() if v}
    return fig


def _fmt(v, unit: str) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f} {unit}" if unit == "seq/s" else f"{v:.1f} {unit}"


@dataclass(frozen=True)
class Target:
    """A figure the check records and judges: its goal (None: no fixed goal, only the comparison with the last
    recorded figure) and its noise band, the most it may fall behind that figure (relative, plus an absolute floor
    in its unit) before it counts as a regression. The bands are the spread of repeated measurements
    (bench/README.md, "Regressions"): steady-state GPU throughputs repeat within 1%, a whole process within 5-10%."""

    id: str
    label: str
    unit: str  # "seq/s" (higher is better) or "s" (lower is better)
    stage: str
    goal: float | None
    goal_source: str
    noise: float
    noise_abs: float = 0.0

    @property
    def higher_is_better(self) -> bool:
        return self.unit == "seq/s"

    def meets_goal(self, value: float) -> bool:
        if self.goal is None:
            return True
        return value >= self.goal if self.higher_is_better else value < self.goal

    def bound(self, last: float) -> float:
        """The worst figure within the noise band of `last`."""
        if self.higher_is_better:
            return last * (1 - self.noise) - self.noise_abs
        return last * (1 + self.noise) + self.noise_abs

    def on_host(self, value: float, captured_epochs_s: float | None, probe: float | None, to_probe: float | None) -> float:
        """`value`, measured on a host of CPU probe `probe`, as a host of `to_probe` would measure it. A throughput is
        the card's. A time's CPU-bound seconds (all but the flagship's captured epochs: process start, imports,
        build, Inductor's compile, the members' launch-bound and DQN's CPU epochs) move with the host, so they are
        scaled by the probes' ratio (`host_probe`); without both probes, the value as it is."""
        if self.higher_is_better or not probe or not to_probe:
            return value
        gpu_bound = captured_epochs_s or 0.0
        return gpu_bound + (value - gpu_bound) * to_probe / probe

    def on_this_host(self, last: dict, probe: float | None) -> float:
        """The last recorded figure (`last_recorded`) as this host, of CPU probe `probe`, would measure it."""
        return self.on_host(last["value"], last.get("captured_epochs_s"), last.get("host_probe_s"), probe)

    def regressed(self, value: float, last: float) -> bool:
        return value < self.bound(last) if self.higher_is_better else value > self.bound(last)

    def better(self, value: float, other: float) -> bool:
        return value > other if self.higher_is_better else value < other

    def goal_text(self) -> str:
        if self.goal is None:
            return "-"
        op = ">=" if self.higher_is_better else "<"
        return f"{op} {self.goal:,.0f}" if self.unit == "seq/s" else f"{op} {self.goal:g} s"

    def noise_text(self) -> str:
        return f"{self.noise:.0%}" + (f" + {self.noise_abs:g} s" if self.noise_abs else "")


POD1, POD2 = "flagship fold at the defaults, pod 1: cold caches", "flagship fold at the defaults, pod 2: pod 1's caches"
TARGETS = [
    Target("b1_fp32", "flagship B=1 fp32, compile + CUDA graph", "seq/s", "b1_fp32", 3000, "issue 33 item 3", 0.03),
    Target("b4096_bf16", "flagship B=4096 bf16, compile + CUDA graph", "seq/s", "b4096_bf16", 550_000, "issue 33 item 3", 0.03),
    Target("b4096_fp32", "flagship B=4096 fp32, compile + CUDA graph", "seq/s", "b4096_fp32", None, "", 0.03),
    Target("fold_cold", POD1, "s", "fold_cold", 25, "issue 33 item 2", 0.10),
    Target("fold_warm", POD2, "s", "fold_warm", 15, "issue 33 item 2", 0.10, 1.0),
    Target("ensemble_sum", "8 supervised members' folds (GPU), summed", "s", "ensemble_fold", 65, "issue 33 item 1", 0.10),
    *[
        Target(
            f"fold_{m}",
            f"{m} fold at the defaults (GPU)",
            "s",
            "ensemble_fold",
            20 if m == "liquid" else None,
            "issue 22 item 5" if m == "liquid" else "",
            0.15,
            1.0,
        )
        for m in SUPERVISED
    ],
    Target("dqn_fold", "DQN fold at the defaults, 16 CPU cores", "s", "dqn_fold", 45, "issue 33 item 5", 0.10),
]


HOST_SLOWER = 1.25  # a host probe this many times the recorded one's (or its inverse): the report says so
# the target ids whose figure holds seconds at the card's pace whatever the host: the flagship's captured epochs
CAPTURED_EPOCHS = {"fold_cold": "flagship cold", "fold_warm": "flagship warm"}
# what every fold's process pays before any GPU work: an interpreter, torch's import and a fixed pure-Python loop
HOST_PROBE = "import torch\ns = 0\nfor i in range(3_000_000):\n    s += i * i"


def host_probe(runs: int = 3) -> float | None:
    """The host's speed, in seconds (the best of `runs` fresh processes running HOST_PROBE; None if it fails). Two
    checks on the same card can run on hosts of different speed: every CPU-bound stage (process start, imports,
    build, Inductor's compile, the members' and DQN's epochs) then moves by about their probes' ratio, the GPU-bound
    figures not (`Target.on_this_host`). Measured on one H100 at a0a98f2 against 99af4e8's record, a probe 1.60x
    slower: the members' folds 1.71x, DQN's 1.62x, the flagship's CPU-bound seconds 1.34x (cold) and 1.54x (warm),
    its captured epochs 0.9x (bench/README.md, "The fourteenth check")."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        if subprocess.run([PY, "-c", HOST_PROBE], capture_output=True).returncode:
            return None
        best = min(best, time.perf_counter() - started)
    return round(best, 3)


def host_note(now: float | None, before: dict | None) -> str:
    """A line for the report when this host's probe differs from the last recorded one's by HOST_SLOWER or more
    (a REGRESSED fold figure may then be the host's: rerun on another lease before changing code); else ''."""
    if now is None or before is None:
        return ""
    ratio = now / before["value"]
    if 1 / HOST_SLOWER < ratio < HOST_SLOWER:
        return ""
    pace = f"{ratio:.2f}x slower" if ratio > 1 else f"{1 / ratio:.2f}x faster"
    return (
        f"host: this machine's CPU probe took {now:.2f} s against {before['value']:.2f} s on {before['commit']}'s "
        f"({pace}): each time is judged against its record's CPU-bound seconds scaled by its probes' ratio (process "
        f"start, imports, build, compile, the members' and DQN's epochs), its GPU-bound ones (the flagship's captured "
        f"epochs) and the throughputs as recorded"
    )


def record(fig: dict) -> dict[str, float | None]:
    """Each target's figure by id, from a check's `figures` (this check's, or one recorded in bench/results/: the
    layout of `figures` has been the same since the first recorded check, so every one of them can be read)."""
    ens = fig.get("ensemble") or {}

    def wall(m: str):
        r = ens.get(m) or {}
        return r.get("wall_s") if r.get("rc") in (0, None) and not r.get("error") else None

    walls = [wall(m) for m in SUPERVISED]
    rec = {k: (fig.get(k) or {}).get("sequences_per_s") for k in ("b1_fp32", "b4096_bf16", "b4096_fp32")}
    rec |= {k: (fig.get(k) or {}).get("fold_s") for k in ("fold_cold", "fold_warm")}
    rec["ensemble_sum"] = sum(walls) if all(w is not None for w in walls) else None
    rec |= {f"fold_{m}": w for m, w in zip(SUPERVISED, walls, strict=True)}
    rec["dqn_fold"] = wall("dqn")
    # not targets: what the next check's host is compared with, and the flagship folds' GPU-bound seconds
    rec["host_probe_s"] = fig.get("host_probe_s")
    stage_s = fig.get("stage_s") or {}
    rec |= {f"{k}_captured_epochs_s": (stage_s.get(name) or {}).get("epochs") for k, name in CAPTURED_EPOCHS.items()}
    return rec


def judged_record(result: dict) -> dict[str, float | None]:
    """A check's figures as judged and recorded: each target's figure, or the second run's where a regressed
    figure was measured again (`confirmation`) and came out better. A second run from a later call (`--second-run`)
    has its own host: its times are first scaled to this check's host by the two probes."""
    rec = record(result["figures"])
    confirmation = result.get("confirmation") or {}
    again = record(confirmation.get("figures") or {})
    for tg in TARGETS:
        first, second = rec.get(tg.id), again.get(tg.id) if tg.stage in confirmation.get("stages", {}) else None
        if second is not None:
            epochs = again.get(f"{tg.id}_captured_epochs_s")
            second = tg.on_host(second, epochs, again.get("host_probe_s"), rec.get("host_probe_s"))
        if second is not None and (first is None or tg.better(second, first)):
            rec[tg.id] = round(second, 3)
    return rec


def gpu_name(result: dict) -> str:
    """The card a recorded check ran on: its `gpu`, or for a record from before that field its `device` ("NVIDIA
    H200 2.11.0+cu130") less the torch version."""
    if result.get("gpu"):
        return result["gpu"]
    device = str(result.get("device", "")).strip()
    head, _, last = device.rpartition(" ")
    return head if head and re.match(r"\d+\.\d+", last) else device


def _order(path: Path, result: dict) -> tuple:
    """Oldest first: the folder's date (bench/results/<gpu>-<date>[suffix]/, else the record's own `date`), the
    record's own `date` (a check recorded later in a folder of earlier calls is the newer), then, for records of
    before that field, the folder's suffix letter and the call number within the folder (gpu_check_call<N>.json)."""
    m = re.search(r"(\d{4}-\d{2}-\d{2})([a-z]*)$", path.parent.name)
    date = m.group(1) if m else str(result.get("date", ""))[:10]
    call = re.search(r"_call(\d+)$", path.stem)
    return date, str(result.get("date") or ""), m.group(2) if m else "", int(call.group(1)) if call else 0


def last_recorded(results_dir: Path, gpu: str, skip: Path | None = None) -> dict[str, dict]:
    """For each target id, the newest figure recorded under `results_dir` (gpu_check*.json, any depth) by a check on
    the same card, with the file and commit it came from, and that record's host probe and captured epochs (for
    `Target.on_this_host`). A record that cannot be read is skipped with a warning."""
    found = []
    for path in sorted(results_dir.rglob("gpu_check*.json")) if results_dir.is_dir() else []:
        if skip is not None and path.resolve().is_relative_to(skip.resolve()):
            continue
        try:
            result = json.loads(path.read_text())
            figs = judged_record(result)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            print(f"warning: {path}: not a GPU check record ({type(exc).__name__}: {exc}); skipped", file=sys.stderr)
            continue
        if gpu_name(result) == gpu:
            found.append((_order(path, result), path, result, figs))
    last: dict[str, dict] = {}
    for _, path, result, figs in sorted(found, key=lambda f: f[0], reverse=True):
        for k, v in figs.items():
            if v is not None and k not in last:
                last[k] = {
                    "value": v,
                    "file": str(path),
                    "commit": result.get("commit", "?"),
                    "host_probe_s": figs.get("host_probe_s"),
                    "captured_epochs_s": figs.get(f"{k}_captured_epochs_s"),
                }
    return last


def verdicts(fig: dict, stages: dict, last: dict[str, dict] | None = None, rec: dict | None = None) -> list[dict]:
    """One row per target: the figure, its goal, the last recorded figure on this card, and the result: PASS;
    REGRESSED (worse than the last recorded figure, as this host would measure it, beyond the noise band); NO FIGURE
    (a stage failed, timed out or did not run); BELOW GOAL (the goal is not met, but the figure is within the band of
    the last one, or there is no last one). REGRESSED and NO FIGURE block (`blocks`); BELOW GOAL is reported, since
    an open goal (issue 33 item 3) would otherwise block every change. `rec`: the figures judged (`judged_record`),
    where a second run replaced a first one's."""
    last = last or {}
    first = record(fig)
    rec = rec or first

    def stage_note(name: str) -> str:
        s = stages.get(name, {})
        return s.get("error") or ("" if s.get("rc") == 0 else f"stage {name} rc {s.get('rc')}")

    rows = []
    t = fig["cuda_tests"]
    ok = stages.get("cuda_tests", {}).get("rc") == 0 and t["failed"] == 0 and t["passed"] > 0
    rows.append(
        {
            "id": "cuda_tests",
            "target": "CUDA test set (pytest -m cuda)",
            "figure": f"{t['passed']} passed, {t['failed']} failed",
            "goal": "all pass",
            "last": "-",
            "result": "PASS" if ok else "FAIL",
            "pass": ok,
            "blocks": not ok,
            "note": ", ".join(t["failures"][:6]) or stage_note("cuda_tests"),
        }
    )
    ens = fig.get("ensemble") or {}
    for tg in TARGETS:
        value, prev = rec.get(tg.id), last.get(tg.id)
        expected = tg.on_this_host(prev, rec.get("host_probe_s")) if prev else None
        here = f"{_fmt(expected, tg.unit)} on this host" if prev and expected != prev["value"] else ""
        notes = [] if value == first.get(tg.id) else [f"a second run's (the first: {_fmt(first.get(tg.id), tg.unit)})"]
        if value is None:
            result = "NO FIGURE"
            model = tg.id.removeprefix("fold_") if tg.id.startswith("fold_") else "dqn" if tg.id == "dqn_fold" else None
            failed = [m for m in SUPERVISED if (ens.get(m) or {}).get("error")] if tg.id == "ensemble_sum" else []
            why = (ens.get(model) or {}).get("error") if model else None
            notes.append(why or (f"failed: {', '.join(failed)}" if failed else "") or stage_note(tg.stage) or "no figure")
        elif prev is not None and tg.regressed(value, expected):
            result = "REGRESSED"
            scaled = f", {here}" if here else ""
            notes.append(f"worse than {_fmt(tg.bound(expected), tg.unit)} (last {prev['commit']}{scaled} +- {tg.noise_text()})")
        else:
            result = "PASS" if tg.meets_goal(value) else "BELOW GOAL"
            notes += [here and f"last {prev['commit']}: {here}", "" if result == "PASS" else tg.goal_source]
        if value is not None and prev is None:
            notes.append("first figure on this card")
        rows.append(
            {
                "id": tg.id,
                "stage": tg.stage,
                "target": tg.label,
                "figure": _fmt(value, tg.unit),
                "value": value,
                "goal": tg.goal_text(),
                "last": _fmt(prev["value"], tg.unit) if prev else "-",
                "last_value": prev["value"] if prev else None,
                "last_on_this_host": expected,
                "last_file": prev["file"] if prev else None,
                "noise": tg.noise_text(),
                "result": result,
                "pass": result == "PASS",
                "blocks": result in ("REGRESSED", "NO FIGURE"),
                "note": "; ".join(n for n in notes if n)[:200],
            }
        )
    return rows


def report(result: dict) -> None:
    print(f"\nGPU check ({result.get('commit', '?')}, {result.get('device', '?')}), {result.get('wall_s', 0):.0f} s in all")
    print(f"{'target':60} {'figure':>16} {'last here':>16} {'band':>10} {'goal':>12}  result      note")
    for r in result["targets"]:
        result_text = r.get("result") or ("PASS" if r["pass"] else "FAIL")
        print(
            f"{r['target']:60} {r['figure']:>16} {r.get('last', '-'):>16} {r.get('noise', ''):>10} {r['goal']:>12}  "
            f"{result_text:10}  {r['note']}"
        )
    per = "  ".join(f"{m} {v['wall_s']:.1f}" for m, v in result["figures"]["ensemble"].items() if v.get("wall_s"))
    print(f"per fold, s: {per}")
    for fold, stages in (result["figures"].get("stage_s") or {}).items():
        text = "  ".join(f"{k} {v:.2f}" for k, v in stages.items() if isinstance(v, int | float))
        print(f"stages of {fold}, s: {text}")
    again = (result.get("confirmation") or {}).get("stages") or {}
    for name, s in [*result["stages"].items(), *((f"{n} (second run)", s) for n, s in again.items())]:
        print(f"stage {name}: rc {s.get('rc')}, {s.get('wall_s')} s{(' ' + s['error']) if s.get('error') else ''}")
    blocking = [r["target"] for r in result["targets"] if r.get("blocks")]
    below = [r["target"] for r in result["targets"] if r.get("result") == "BELOW GOAL"]
    if below:
        print(f"below goal (open, not blocking): {'; '.join(below)}")
    if result.get("host"):
        print(result["host"])
    print(f"BLOCKED by: {'; '.join(blocking)}" if blocking else "no regression beyond the noise bands: the check passes")
    if result.get("record_as") and result.get("blocked"):
        print(f"keep this check: commit {result['record_as']} (beside the records: no later check compares with it)")
    elif result.get("record_as"):
        print(f"record this check: commit {result['record_as']} (its figures are what the next check compares with)")


def judge(result: dict, results_dir: Path, skip: Path | None = None) -> dict:
    """Judge a check's figures against its goals and the last figures recorded under `results_dir` for its card;
    adds `targets`, `compared_with`, `all_pass` (every row PASS) and `blocked` (a row REGRESSED or without figure)."""
    last = last_recorded(results_dir, gpu_name(result), skip)
    result["record"] = judged_record(result)
    result["targets"] = verdicts(result["figures"], result["stages"], last, result["record"])
    result["compared_with"] = {k: v for k, v in last.items() if k in result["record"]}
    result["all_pass"] = all(r["pass"] for r in result["targets"])
    result["blocked"] = any(r["blocks"] for r in result["targets"])
    result["host"] = host_note(result["record"]["host_probe_s"], last.get("host_probe_s"))
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/out/gpu_check")))
    p.add_argument("--deadline-s", type=float, default=560, help="seconds from now by which every stage has ended")
    p.add_argument(
        "--stages", default=DEFAULT_STAGES, help=f"comma-separated (default: {DEFAULT_STAGES}; dqn_threads: a diagnostic)"
    )
    p.add_argument("--results-dir", type=Path, default=Path("bench/results"), help="the recorded checks to compare with")
    p.add_argument("--report-only", type=Path, help="print the report of this gpu_check.json as it was judged")
    p.add_argument(
        "--judge", type=Path, help="judge this gpu_check.json again against --results-dir, in place; exit 1 if blocked"
    )
    p.add_argument(
        "--second-run",
        type=Path,
        help="with --judge: a later call's gpu_check.json of the same commit (--stages naming the stages this check "
        "regressed) as this check's second run of them",
    )
    p.add_argument(
        "--judge-outputs",
        type=Path,
        help="judge what a killed check left in this folder (its gpu_check.log and raw files); writes its gpu_check.json",
    )
    args = p.parse_args()
    if args.report_only:
        report(json.loads(args.report_only.read_text()))
        return 0
    if args.judge:  # the judgement is rewritten in the file, with where to record it
        result = json.loads(args.judge.read_text())
        if args.second_run:
            result["confirmation"] = second_run(result, json.loads(args.second_run.read_text()))
        result = judge(result, args.results_dir, skip=args.judge.parent)
        result["record_as"] = record_as(result, checked_at(result))
        atomic_text(args.judge, json.dumps(result, indent=1, default=str))
        report(result)
        return 1 if result["blocked"] else 0
    if args.judge_outputs:
        result = judge_outputs(args.judge_outputs, args.results_dir)
        atomic_text(args.judge_outputs / "gpu_check.json", json.dumps(result, indent=1, default=str))
        report(result)
        return 1 if result["blocked"] else 0
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    probe = host_probe()
    empty_caches()
    names = "import torch; print(torch.cuda.get_device_name()); print(torch.__version__)"
    gpu, torch_version = ([*subprocess.run([PY, "-c", names], capture_output=True, text=True).stdout.split("\n"), "", ""])[:2]
    now = datetime.datetime.now(datetime.UTC)
    commit = os.environ.get("GPU_CHECK_COMMIT", "?")
    header = {"commit": commit, "gpu": gpu, "torch": torch_version, "date": now.isoformat(timespec="seconds")}
    stages = run_stages(args.out, started + args.deadline_s, args.stages.split(","), header)
    result = {
        **header,
        "device": f"{gpu} {torch_version}",
        "cores": os.cpu_count(),
        "stages": stages,
        "figures": figures(args.out, stages) | {"host_probe_s": probe},
    }
    judge(result, args.results_dir, skip=args.out)
    regressed = {r.get("stage") for r in result["targets"] if r["result"] == "REGRESSED"}
    again = [name for name in CONFIRMABLE if name in regressed]
    if again:  # a regression that does not repeat was the host's, not the code's: its stage runs once more
        print(f"regressed: {', '.join(again)}; measuring again", flush=True)
        confirm = args.out / "confirm"
        stages = run_stages(confirm, started + args.deadline_s, again)
        stages = {name: s for name, s in stages.items() if name in again}
        result["confirmation"] = {"stages": stages, "figures": figures(confirm, stages)}
        judge(result, args.results_dir, skip=args.out)
    result["wall_s"] = time.monotonic() - started
    result["record_as"] = record_as(result, now)
    atomic_text(args.out / "gpu_check.json", json.dumps(result, indent=1, default=str))
    report(result)
    return 1 if result["blocked"] else 0


def second_run(result: dict, later: dict) -> dict:
    """A later call's check of the same commit as `result`'s second run (`confirmation`) of the stages it can run
    again (`CONFIRMABLE`) and ran: where a check's own call had no time left for its second runs. Its figures keep
    their host probe, by which `judged_record` scales them to this check's host."""
    if later.get("commit") != result.get("commit") or gpu_name(later) != gpu_name(result):
        raise SystemExit(
            f"--second-run: a check of {later.get('commit')} on {gpu_name(later)}, not of "
            f"{result.get('commit')} on {gpu_name(result)}"
        )
    ran = {name: s for name, s in later["stages"].items() if name in CONFIRMABLE and s.get("rc") == 0}
    return {"stages": ran, "figures": later["figures"], "date": later.get("date")}


def judge_outputs(out: Path, results_dir: Path) -> dict:
    """The judgement of a check that was killed before it wrote its gpu_check.json (its call's time or the session's
    device budget ran out): its header, stages and figures from what it left in `out`, judged as `main` would.
    Stages it never finished have no figure, so such a check is blocked and recorded as one."""
    log = (out / "gpu_check.log").read_text()
    header = log_header(log)
    stages = stages_from_log(log)
    gpu, torch_version = header.get("gpu", "?"), header.get("torch", "?")
    result = {
        "commit": header.get("commit", "?"),
        "gpu": gpu,
        "torch": torch_version,
        "date": header.get("date", "?"),
        "device": f"{gpu} {torch_version}",
        "stages": stages,
        "figures": figures(out, stages),
        "cut_short": True,
    }
    judge(result, results_dir, skip=out)
    result["record_as"] = record_as(result, checked_at(result))
    return result


def checked_at(result: dict) -> datetime.datetime:
    """When a check ran: its `date`, or now for a record without one."""
    date = result.get("date")
    return datetime.datetime.fromisoformat(date) if date and date != "?" else datetime.datetime.now(datetime.UTC)


def record_as(result: dict, now: datetime.datetime) -> str:
    """Where to commit a judged check: as `gpu_check.json`, whose figures the next check on this card compares with,
    or, when it is blocked, as `blocked_check_<commit>.json` beside it, kept but never compared with (`last_recorded`
    reads `gpu_check*.json` only): a blocked check's figures, recorded as the last, would carry its regression into
    the next check's bands."""
    name = f"blocked_check_{result.get('commit', '?')}.json" if result["blocked"] else "gpu_check.json"
    return f"bench/results/{_slug(result['gpu'])}-{now:%Y-%m-%d}/{name}"


def _slug(gpu: str) -> str:
    """The results folder's card name: "NVIDIA H200" -> h200, "NVIDIA H100 80GB HBM3" -> h100."""
    m = re.search(r"\b([A-Z]\d{2,4}[A-Z]*)\b", gpu)
    return (m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "unknown").lower()


def atomic_text(path: Path, text: str) -> None:
    """Write whole or not at all: a check cut short leaves no half-written JSON for the next one to read."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
