"""Attempts and promotion, writer locks, unit verification, and temporary cleanup that is safe across hosts."""

from __future__ import annotations

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

    artifacts.run_attempt(dest, attempt_id, build, lambda folder: (folder / "summary.json").read_text(),
                          promote_when_done=False)
    return artifacts.Attempt(dest, attempt_id)


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
    _attempt(dest, "first", "run-a")
    calls = []
    result = artifacts.run_attempt(dest, "run-a", lambda folder: calls.append(1), lambda folder: "reused")
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
    with (artifacts.writing(attempt), pytest.raises(PlanError, match=r"is being written by .*~\d+~\d+ since"),
          artifacts.writing(attempt)):
        pass
    with artifacts.writing(attempt):  # released
        pass


def test_a_dead_writers_lock_is_taken_over(tmp_path):
    attempt = artifacts.Attempt(tmp_path / "fold-0", "run-a")
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(proc.stdout)
    attempt.path.mkdir(parents=True)
    from alpha_core.atomic import owner_tag

    host_ns = owner_tag().rsplit("~", 1)[0]
    (attempt.path / artifacts.LOCK).write_text(f'{{"owner": "{host_ns}~{dead_pid}", "since": "then"}}')
    with artifacts.writing(attempt):
        pass


def test_verify_catches_a_mix_of_two_runs(tmp_path):
    dest = tmp_path / "fold-0"
    artifacts.promote(_attempt(dest, "old", "run-a"))
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
    writer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sh", "-c", run_writer, WRITER, str(cache),
                               str(ready)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert writer.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        (temp,) = [p for p in cache.iterdir() if TMP_MARK in p.name]
        assert temp.name.split(TMP_MARK)[1].split("~")[2] == "2"
        clean = ("import sys; from pathlib import Path; from alpha_core.atomic import remove_stale_temporaries; "
                 "print(len(remove_stale_temporaries(Path(sys.argv[1]))))")
        out = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", clean, str(cache)], env=env,
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "0" and (temp / "features.npy").exists()
    finally:
        writer.kill()
        writer.wait()
