"""Fencing: a writer frozen past its lock's staleness (SIGSTOP, as a node freeze, a long GC pause or a preempted VM
does) never changes what the writer that took over wrote; it stops at its next commit with one line and exit 2.
Lock staleness is judged by the filesystem's clock, so a host whose clock runs ahead takes no live lock, and two
processes repairing one corrupt sidecar both succeed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import SMALL_BOOK, flags

from alpha_core import artifacts
from alpha_core.errors import PlanError
from alpha_core.locks import Lock, LockLost, lock_age

ROOT = Path(__file__).resolve().parents[1]
HEARTBEAT_S = "0.2"  # a lock is stale after 1.2 s without a heartbeat
WAIT_S = 300  # generous: a loaded 2-core machine


def _env(fault: str = "") -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ALPHA_FAULT": fault,
        "ALPHA_LOCK_HEARTBEAT_S": HEARTBEAT_S,
        "OMP_NUM_THREADS": "1",
    }


def _cli(argv: list[str], fault: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "alpha_core.cli", *argv], env=_env(fault), capture_output=True, text=True, timeout=WAIT_S
    )


def _start_frozen(argv: list[str], point: str) -> subprocess.Popen:
    """Start the CLI and wait until it has frozen itself (SIGSTOP) at `point`, holding its lock."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "alpha_core.cli", *argv],
        env=_env(f"stop:{point}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        proc.returncode = os.waitstatus_to_exitcode(status)
        pytest.fail(f"the writer did not freeze at {point} (exit {proc.returncode}): {proc.stderr.read()[-2000:]}")
    return proc


def _until_stale(lock: Path) -> None:
    """Wait (by the test's clock, generously) until the frozen writer's lock is past its staleness."""
    deadline = time.monotonic() + WAIT_S
    stale = 6 * float(HEARTBEAT_S)  # `stale_seconds()` of the writers, which run with ALPHA_LOCK_HEARTBEAT_S
    while (age := lock_age(lock)) is None or age <= 2 * stale:
        assert time.monotonic() < deadline, f"{lock} never went stale"
        time.sleep(0.1)


def _wake(proc: subprocess.Popen) -> tuple[int, str]:
    os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=WAIT_S)
    return proc.returncode, err


def _lost_line(err: str) -> None:
    lines = [line for line in err.splitlines() if "lost its lock" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]


# --- the clock: staleness by the filesystem's own times ------------------------------------------------------


def test_a_clock_far_ahead_takes_no_live_lock(tmp_path, monkeypatch):
    """A judge whose clock runs 90 s ahead (another pod without NTP) sees a live lock as live."""
    monkeypatch.setenv("ALPHA_LOCK_HEARTBEAT_S", HEARTBEAT_S)
    lock_path = tmp_path / "shared" / "x.lock"
    holder = Lock(lock_path, run="run-a", step="writer")
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with holder.hold():
            holding.set()
            done.wait(60)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(30)
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 90.0)
        judge = Lock(lock_path, run="run-b", step="other")
        for _ in range(3):  # over several heartbeats
            assert judge.try_acquire() is not None, "a skewed clock took a live lock"
            time.sleep(float(HEARTBEAT_S))
        holder.check()  # the holder still holds it
    finally:
        done.set()
        thread.join()


def test_a_lock_without_heartbeat_is_stale_by_the_filesystems_clock(tmp_path, monkeypatch):
    """The other direction: a judge whose clock runs behind still takes a lock whose heartbeat stopped."""
    monkeypatch.setenv("ALPHA_LOCK_HEARTBEAT_S", HEARTBEAT_S)
    lock_path = tmp_path / "x.lock"
    lock_path.write_text(json.dumps({"run": "r", "step": "s", "owner": "gone-host~1~1", "token": "t", "since": "then"}))
    old = time.time() - 10
    os.utime(lock_path, (old, old))
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 90.0)
    assert Lock(lock_path, run="run-b", step="other").try_acquire() is None


# --- attempts: generations, the fence, read-only seals ----------------------------------------------------


def test_a_takeover_writes_a_new_generation_and_the_old_writer_cannot_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("ALPHA_LOCK_HEARTBEAT_S", HEARTBEAT_S)
    from alpha_core.atomic import atomic_write_bytes

    attempt = artifacts.Attempt(tmp_path / "fold-0", "run-a")
    with artifacts.writing(attempt) as old:
        atomic_write_bytes(old.folder / "state.json", b"epoch 1")
        # the retry of this very step takes over at once (as after the old writer froze past the staleness)
        with artifacts.writing(attempt, retry=True, inherit=True) as new:
            assert new.folder != old.folder and new.generation == old.generation + 1
            assert (new.folder / "state.json").read_bytes() == b"epoch 1"  # the last committed state, copied
            with pytest.raises(LockLost, match="lost its lock"):
                atomic_write_bytes(old.folder / "state.json", b"zombie")
            with pytest.raises(LockLost):
                artifacts.complete(attempt, old)
            atomic_write_bytes(new.folder / "model.safetensors", b"good")
            artifacts.complete(attempt, new)
    assert attempt.path == new.folder and artifacts.verify(attempt.path, deep=True) == []
    artifacts.promote(attempt)
    assert (tmp_path / "fold-0" / "model.safetensors").read_bytes() == b"good"
    # sealed: read-only files, and no writer commits into it
    assert not os.stat(new.folder / "model.safetensors").st_mode & 0o222
    with pytest.raises(PermissionError, match="sealed attempt"):
        atomic_write_bytes(new.folder / "model.safetensors", b"overwrite")


def test_a_damaged_complete_attempt_is_rebuilt_never_promoted(tmp_path, capsys):
    dest = tmp_path / "fold-0"
    attempt = artifacts.Attempt(dest, "run-a")
    artifacts.run_attempt(attempt, lambda f: (f / "model.safetensors").write_text("good"), lambda f: None)
    damaged = attempt.path
    os.chmod(damaged / "model.safetensors", 0o644)
    (damaged / "model.safetensors").write_text("evil")  # same size, other bytes: only a deep verify sees it
    with pytest.raises(PlanError, match="damaged attempt is not promoted"):
        artifacts.promote(attempt)
    assert not dest.exists()
    built = []
    artifacts.run_attempt(attempt, lambda f: built.append((f / "model.safetensors").write_text("good")), lambda f: None)
    assert built and attempt.path != damaged and "damaged" in capsys.readouterr().out
    artifacts.promote(attempt)
    assert artifacts.verify(dest, deep=True) == []


# --- the writers, frozen past staleness: training, the report, the sidecar cache ------------------------------

PERCEPTION = flags(**SMALL_BOOK, early_stop_metric="none")


@pytest.mark.slow
def test_a_frozen_trainer_never_damages_the_run_that_took_over(tiny_data, tmp_path):
    """`alpha train` freezes after its first epoch's state; a `--resume` takes over, finishes and promotes. The
    frozen writer, woken, stops at its next commit (exit 2, one line) and the promoted fold stays intact, for a
    later `--resume` too."""
    out = tmp_path / "out"
    argv = [
        "train",
        "--mbp10-data-dir",
        str(tiny_data / "ES.FUT" / "mbp-10"),
        "--predecoded-dir",
        str(tmp_path / "pd"),
        *PERCEPTION,
        "--out",
        str(out),
    ]
    frozen = _start_frozen(argv, "state.after_commit#1")
    try:
        (first,) = artifacts.attempts(out / "fold-0")
        _until_stale(first.path / artifacts.LOCK)
        resumed = _cli([*argv, "--resume"])
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    finally:
        rc, err = _wake(frozen)
    assert rc == 2
    _lost_line(err)
    fold = out / "fold-0"
    assert artifacts.verify(fold, deep=True) == []
    summary = json.loads((fold / "alpha_train_summary.json").read_text())
    assert summary["epochs"] == 3 and len(summary["epoch_metrics"]) == 3
    assert Path(os.readlink(fold)).name == f"{first.id}{artifacts.GENERATION}1"  # the new generation, not the old
    again = _cli([*argv, "--resume"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert artifacts.verify(fold, deep=True) == []


@pytest.fixture(scope="module")
def tft_models(tiny_data, tmp_path_factory):
    """A tiny trained tft fold, laid out as `alpha evaluate --models-dir` reads it."""
    tmp = tmp_path_factory.mktemp("fencing-tft")
    argv = ["train-supervised", "--model", "tft", "--data-dir", str(tiny_data / "ES.FUT")]
    argv += flags(predecoded_dir=tmp / "pd", epochs=1, cv_n_folds=2, cv_train_window=2)
    argv += flags(cv_fold=0, seq_len=16, batch_size=32, n_train_seqs=64, n_val_seqs=64)
    argv += flags(device="cpu", param="d_model=16", output_dir=tmp / "models" / "tft" / "ES.FUT")
    done = _cli(argv)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp


@pytest.mark.slow
@pytest.mark.parametrize(
    "point",
    [
        "tmp.before_commit@ensemble_report.md",  # frozen just before its Markdown replaces the one there
        "tmp.before_commit@ensemble_report.json",  # its whole set written but the JSON, about to be renamed
    ],
)
def test_a_frozen_report_writer_never_damages_the_report_that_took_over(tft_models, tiny_data, tmp_path, point):
    from alpha_core.eval.report import load_report

    out = tmp_path / "eval" / "ensemble_report.json"
    argv = ["evaluate", "--models-dir", str(tft_models / "models"), "--data-dir", str(tiny_data)]
    argv += flags(predecoded_dir=tft_models / "pd", device="cpu", min_val_auc=0)
    argv += ["--min-val-sharpe", "-1000", "--output", str(out)]
    frozen = _start_frozen(argv, point)
    try:
        _until_stale(out.with_name(f".{out.name}.lock"))
        second = _cli(argv)
        assert second.returncode == 0, second.stderr[-3000:]
        good = {p.name: p.read_bytes() for p in out.parent.iterdir() if not p.name.startswith(".")}
        assert "ensemble_report.md" in good and any(name.endswith(".png") for name in good), sorted(good)
    finally:
        rc, err = _wake(frozen)
    assert rc == 2
    _lost_line(err)
    load_report(out)  # the set is whole: every companion is the one written with its JSON
    assert {p.name: p.read_bytes() for p in out.parent.iterdir() if not p.name.startswith(".")} == good


@pytest.mark.slow
def test_a_frozen_search_never_replaces_the_results_of_the_one_that_took_over(tiny_data, tmp_path):
    out = tmp_path / "hyperopt" / "results.json"
    argv = ["hyperopt", *flags(model="mamba2", trials=2, epochs=1, data_dir=tiny_data / "ES.FUT")]
    argv += flags(seq_len=16, batch_size=32, n_train_seqs=64, n_val_seqs=64, device="cpu")
    argv += ["--predecoded-dir", str(tmp_path / "pd"), "--output", str(out)]
    frozen = _start_frozen([*argv, "--seed", "1"], "hyperopt.before_results")  # its trials run, its results not written
    try:
        _until_stale(out.with_name(f".{out.name}.lock"))
        second = _cli([*argv, "--seed", "2"])
        assert second.returncode == 0, second.stderr[-3000:]
    finally:
        rc, err = _wake(frozen)
    assert rc == 2
    _lost_line(err)
    assert json.loads(out.read_text())["seed"] == 2


def _corrupt(cache: Path) -> Path:
    sidecar = next(p for p in sorted(cache.rglob("*.book.*")) if p.is_dir())
    features = sidecar / "features.npy"
    with features.open("r+b") as fh:
        fh.truncate(features.stat().st_size // 2)
    return sidecar


def _arrays(cache: Path) -> dict[str, bytes]:
    return {p.relative_to(cache).as_posix(): p.read_bytes() for p in sorted(cache.rglob("*.npy")) if ".tmp~" not in str(p)}


@pytest.mark.slow
def test_a_frozen_sidecar_repair_never_damages_the_repair_that_took_over(tiny_data, tmp_path):
    cache = tmp_path / "pd"
    argv = ["predecode", "--data-dir", str(tiny_data), "--symbols", "ES.FUT"]
    argv += ["--predecoded-dir", str(cache)]
    assert _cli(argv).returncode == 0
    good = _arrays(cache)
    sidecar = _corrupt(cache)
    frozen = _start_frozen(argv, "sidecar.locked")  # holds the corrupt sidecar's lock, has written nothing
    try:
        _until_stale(sidecar.with_name(f".{sidecar.name}.lock"))
        repair = _cli(argv)
        assert repair.returncode == 0, repair.stderr[-3000:]
    finally:
        rc, err = _wake(frozen)
    assert rc == 2
    _lost_line(err)
    assert _arrays(cache) == good
    assert _cli(argv).returncode == 0 and _arrays(cache) == good


@pytest.mark.slow
def test_two_repairs_of_one_corrupt_sidecar_both_succeed(tiny_data, tmp_path):
    """One repairs (slowed down while it holds the sidecar's lock, its heartbeat going on), the other waits for it
    and reuses its sidecar: both exit 0 and the cache is whole."""
    cache = tmp_path / "pd"
    argv = ["predecode", "--data-dir", str(tiny_data), "--symbols", "ES.FUT"]
    argv += ["--predecoded-dir", str(cache)]
    assert _cli(argv).returncode == 0
    good = _arrays(cache)
    _corrupt(cache)
    cmd = [sys.executable, "-m", "alpha_core.cli", *argv]
    first = subprocess.Popen(cmd, env=_env("sleep=3:sidecar.locked"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    second = subprocess.Popen(cmd, env=_env("sleep=3:sidecar.locked"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    errs = [p.communicate(timeout=WAIT_S)[1].decode() for p in (first, second)]
    assert (first.returncode, second.returncode) == (0, 0), errs
    assert _arrays(cache) == good
