"""Attempts and promotion, writer locks that belong to a run and step, unit verification, and cleanup that is safe
across hosts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from alpha_core import artifacts
from alpha_core.atomic import TMP_MARK, atomic_directory, remove_stale_temporaries
from alpha_core.errors import PlanError


def _attempt(dest: Path, text: str, attempt_id: str) -> artifacts.Attempt:
    def build(folder: Path) -> str:
        (folder / "model.safetensors").write_text(text)
        (folder / "summary.json").write_text(f'{{"text": "{text}"}}')
        return text

    attempt = artifacts.Attempt(dest, attempt_id)
    artifacts.run_attempt(attempt, build, lambda folder: (folder / "summary.json").read_text())
    return attempt


def test_only_promotion_changes_what_dest_shows(tmp_path):
    dest = tmp_path / "models" / "tft" / "ES.FUT" / "fold-0"
    passing = _attempt(dest, "passing", "run-a")
    artifacts.promote(passing)
    assert (dest / "model.safetensors").read_text() == "passing" and artifacts.promoted(dest) == passing
    failing = _attempt(dest, "gate-failed", "run-b")  # a later attempt under the same RUN_ID, never promoted
    assert (dest / "model.safetensors").read_text() == "passing"
    assert (failing.path / "model.safetensors").read_text() == "gate-failed"
    assert artifacts.verify(dest, deep=True) == [] and artifacts.verify(failing.path, deep=True) == []


def test_a_completed_attempt_is_reused_not_rebuilt(tmp_path):
    dest = tmp_path / "fold-0"
    artifacts.promote(_attempt(dest, "first", "run-a"))
    calls = []
    result = artifacts.run_attempt(artifacts.Attempt(dest, "run-a"), lambda folder: calls.append(1), lambda folder: "reused")
    assert result == "reused" and not calls and (dest / "model.safetensors").read_text() == "first"


def test_an_incomplete_attempt_cannot_be_promoted(tmp_path):
    attempt = artifacts.Attempt(tmp_path / "fold-0", "run-a")
    attempt.path.mkdir(parents=True)
    (attempt.path / "model.safetensors").write_text("half")
    with pytest.raises(PlanError, match="incomplete attempt"):
        artifacts.promote(attempt)
    assert not (tmp_path / "fold-0").exists()


def test_a_second_writer_fails_fast_naming_the_owner(tmp_path):
    attempt = artifacts.Attempt(tmp_path / "fold-0", "run-a")
    with (
        artifacts.writing(attempt),
        pytest.raises(
            PlanError,
            match=r"is being written by .*~\d+~\d+ \(run run-a, "
            r"step .*fold-0\) since .*heartbeat \d+ s ago",
        ),
        artifacts.writing(attempt),
    ):
        pass
    with artifacts.writing(attempt):  # released
        pass


def _foreign_lock(attempt: artifacts.Attempt, owner: str, run: str | None = None, age_s: float = 0.0) -> Path:
    """A lock as another pod's writer leaves it when its node is lost."""
    attempt.path.mkdir(parents=True, exist_ok=True)
    lock = attempt.path / artifacts.LOCK
    lock.write_text(
        json.dumps({"run": run or attempt.id, "step": str(attempt.dest), "owner": owner, "token": "t0", "since": "then"})
    )
    os.utime(lock, (time.time() - age_s, time.time() - age_s))
    return lock


def test_a_dead_writers_lock_is_taken_over(tmp_path):
    attempt = artifacts.Attempt(tmp_path / "fold-0", "run-a")
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    from alpha_core.atomic import owner_tag

    _foreign_lock(attempt, f"{owner_tag().rsplit('~', 1)[0]}~{int(proc.stdout)}")
    with artifacts.writing(attempt):
        pass


def test_a_retry_of_the_same_step_on_another_pod_takes_the_attempt_over_at_once(tmp_path):
    """Dagster retries a pre-empted step in a new pod: another host, another PID namespace, the same run and step.
    The retry takes the attempt over at once; anyone else still waits for the heartbeat to go stale."""
    attempt = artifacts.Attempt(tmp_path / "fold-0", "run-a")
    _foreign_lock(attempt, "pod-gpu-7f3~4026532201~1")
    # a plain second writer (or a resume) while the heartbeat is fresh waits
    with pytest.raises(PlanError, match=r"pod-gpu-7f3~4026532201~1 \(run run-a"), artifacts.writing(attempt):
        pass
    with artifacts.writing(attempt, retry=True):
        assert json.loads((attempt.path / artifacts.LOCK).read_text())["owner"] != "pod-gpu-7f3~4026532201~1"
    _foreign_lock(attempt, "pod-gpu-7f3~4026532201~1", run="another-run")
    with pytest.raises(PlanError), artifacts.writing(attempt, retry=True):  # a retry of ANOTHER run is no retry of this
        pass


def test_a_lock_of_a_vanished_host_is_taken_over_once_its_heartbeat_is_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("ALPHA_LOCK_HEARTBEAT_S", "5")  # stale after 30 s
    attempt = artifacts.Attempt(tmp_path / "fold-0", "run-a")
    _foreign_lock(attempt, "gone-host~4026532201~7", age_s=20)
    with pytest.raises(PlanError, match=r"heartbeat 2\d s ago"), artifacts.writing(attempt):
        pass
    _foreign_lock(attempt, "gone-host~4026532201~7", age_s=31)
    with artifacts.writing(attempt):  # a resume from any host, a minute after the writer vanished
        pass


@pytest.mark.parametrize("content", ["", '{"owner": "pod~1~1"', "not json"])
def test_an_empty_or_torn_lock_is_no_wall(tmp_path, content):
    """Locks are created whole (linked into place), so an unreadable one is a crash of an older writer: taken over."""
    attempt = artifacts.Attempt(tmp_path / "fold-0", "run-a")
    attempt.path.mkdir(parents=True)
    (attempt.path / artifacts.LOCK).write_text(content)
    with artifacts.writing(attempt):
        pass


def test_a_crash_while_taking_a_lock_leaves_no_lock(tmp_path):
    script = textwrap.dedent(f"""
        from pathlib import Path
        from alpha_core import artifacts
        with artifacts.writing(artifacts.Attempt(Path({str(tmp_path / "fold-0")!r}), "run-a")):
            pass
    """)
    env = {**os.environ, "ALPHA_FAULT": "lock.before_link"}
    assert subprocess.run([sys.executable, "-c", script], env=env).returncode == -9
    attempt = artifacts.Attempt(tmp_path / "fold-0", "run-a")
    assert not (attempt.path / artifacts.LOCK).exists()
    with artifacts.writing(attempt):
        pass


def test_a_writer_that_lost_its_lock_cannot_complete(tmp_path):
    """A zombie (back after its retry took over) never seals the attempt its successor is writing."""
    attempt = artifacts.Attempt(tmp_path / "fold-0", "run-a")
    with artifacts.writing(attempt) as lock:
        (attempt.path / "model.safetensors").write_text("zombie")
        _foreign_lock(attempt, "pod-retry~4026532201~1")  # the retry took the lock over meanwhile
        with pytest.raises(PlanError, match="lost its lock to pod-retry~4026532201~1"):
            artifacts.complete(attempt, lock)
    assert not attempt.complete and (attempt.path / artifacts.LOCK).exists()  # the successor's lock stays


def test_the_folds_of_a_run_are_promoted_together(tmp_path):
    units = [_attempt(tmp_path / f"fold-{k}", f"new-{k}", "run-b") for k in range(2)]
    half = artifacts.Attempt(tmp_path / "fold-2", "run-b")
    half.path.mkdir(parents=True)
    with pytest.raises(PlanError, match="not promoting a run with incomplete folds"):
        artifacts.promote_all([*units, half])
    assert not any((tmp_path / f"fold-{k}").exists() for k in range(3))
    artifacts.promote_all(units)
    assert [artifacts.promoted(tmp_path / f"fold-{k}").id for k in range(2)] == ["run-b", "run-b"]


def test_verify_catches_a_mix_of_two_runs(tmp_path):
    dest = tmp_path / "fold-0"
    artifacts.promote(_attempt(dest, "old", "run-a"))
    os.chmod(dest / "model.safetensors", 0o644)  # sealed files are read-only: only a deliberate chmod gets past
    (dest / "model.safetensors").write_text("new weights")  # a rerun writing in place: what attempts prevent
    (dest / "extra.safetensors").write_text("x")
    problems = artifacts.verify(dest, deep=True)
    assert any("changed since the attempt completed" in p for p in problems)
    assert any("extra.safetensors: not part of the completed attempt" in p for p in problems)
    shutil.rmtree(tmp_path / ".fold-0.attempts" / "run-a")
    (tmp_path / ".fold-0.attempts" / "run-a").mkdir()
    assert "incomplete" in artifacts.verify(dest)[0]


def test_promotion_replaces_a_folder_from_before_attempts(tmp_path):
    dest = tmp_path / "fold-0"
    dest.mkdir()
    (dest / "model.safetensors").write_text("legacy")
    artifacts.promote(_attempt(dest, "new", "run-a"))
    assert (dest / "model.safetensors").read_text() == "new"
    legacy = [p for p in artifacts.attempts_dir(dest).iterdir() if p.name.startswith("legacy-")]
    assert len(legacy) == 1 and (legacy[0] / "model.safetensors").read_text() == "legacy"


# --- temporaries ----------------------------------------------------------------------------------


def test_temporaries_of_another_host_survive_until_their_lease_expires(tmp_path, monkeypatch):
    other = tmp_path / f".x{TMP_MARK}other-host~4026531836~1~abcd"
    other.mkdir()
    assert remove_stale_temporaries(tmp_path) == [] and other.exists()  # pid 1 elsewhere says nothing here
    monkeypatch.setenv("ALPHA_TMP_LEASE_S", "60")
    old = time.time() - 120
    os.utime(other, (old, old))
    assert remove_stale_temporaries(tmp_path) == [other] and not other.exists()


def test_a_killed_local_writers_temporary_is_removed(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from alpha_core.atomic import atomic_directory
        with atomic_directory(Path({str(tmp_path / "sidecar")!r})) as tmp:
            (tmp / "features.npy").write_bytes(b"half")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert subprocess.run([sys.executable, "-c", script]).returncode == -9
    left = [p for p in tmp_path.iterdir() if TMP_MARK in p.name]
    assert len(left) == 1 and not (tmp_path / "sidecar").exists()
    assert remove_stale_temporaries(tmp_path) == left


def test_a_live_writers_temporary_is_kept_and_a_heartbeat_keeps_it_fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("ALPHA_TMP_LEASE_S", "0.4")
    with atomic_directory(tmp_path / "sidecar") as tmp:
        os.utime(tmp, (time.time() - 10, time.time() - 10))
        time.sleep(0.3)  # the heartbeat (every lease / 4) touches it again
        assert remove_stale_temporaries(tmp_path) == [] and tmp.exists()
    assert (tmp_path / "sidecar").is_dir()


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


WRITER = """
import sys, time
from pathlib import Path
from alpha_core.atomic import atomic_directory
with atomic_directory(Path(sys.argv[1]) / "sidecar") as tmp:
    (tmp / "features.npy").write_bytes(b"x" * 1024)
    Path(sys.argv[2]).touch()
    time.sleep(30)
"""


@pytest.mark.skipif(not _unshare_works(), reason="unshare --pid is not permitted here (needs root or user namespaces)")
def test_cleanup_in_another_pid_namespace_never_deletes_a_live_writers_temporary(tmp_path):
    """Two PID namespaces share one cache, as two pods share a volume: the writer's pid means nothing to the other."""
    cache, ready = tmp_path / "cache", tmp_path / "ready"
    cache.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    # in its namespace the writer is pid 2 (sh is 1); the cleaner's namespace has no pid 2 at all
    run_writer = f'"{sys.executable}" -c "$0" "$1" "$2"'
    writer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "sh", "-c", run_writer, WRITER, str(cache), str(ready)], env=env
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert writer.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        (temp,) = [p for p in cache.iterdir() if TMP_MARK in p.name]
        assert temp.name.split(TMP_MARK)[1].split("~")[2] == "2"
        clean = (
            "import sys; from pathlib import Path; from alpha_core.atomic import remove_stale_temporaries; "
            "print(len(remove_stale_temporaries(Path(sys.argv[1]))))"
        )
        out = subprocess.run(
            ["unshare", "--pid", "--fork", sys.executable, "-c", clean, str(cache)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == "0" and (temp / "features.npy").exists()
    finally:
        writer.kill()
        writer.wait()
