"""The output volume is NFS (deploy/k8s/training-output-pvc.yaml), which has no renameat2(RENAME_EXCHANGE): the commit
protocol must stay atomic there. NFS cannot be mounted here, so only the filesystem's answer to that one call is
simulated (EINVAL, what the NFS client returns); the probe, the choice of commit path and every rename, symlink and
removal run for real on this machine's filesystem.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alpha_core import atomic

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def nfs(monkeypatch):
    """This process's filesystem answers renameat2(RENAME_EXCHANGE) as NFS does."""
    monkeypatch.setattr(atomic, "_rename_exchange", lambda a, b: errno.EINVAL)
    monkeypatch.setattr(atomic, "_EXCHANGE_SUPPORT", {})


def commit(final: Path, value: str) -> None:
    """One training-state commit: two files that must always be read from the same commit."""
    with atomic.atomic_directory(final, replace=True) as tmp:
        (tmp / "a").write_text(value)
        (tmp / "b").write_text(value)


def state(final: Path) -> tuple[str, str] | None:
    """What a reader sees at `final` (None: nothing there)."""
    try:
        return (final / "a").read_text(), (final / "b").read_text()
    except FileNotFoundError:
        return None


@pytest.mark.skipif(sys.platform != "linux", reason="renameat2 is Linux's")
def test_the_probe_tells_nfs_from_a_local_filesystem(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_EXCHANGE_SUPPORT", {})
    assert atomic.rename_exchange_supported(tmp_path) is True  # this machine's disk: the real call
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing behind
    monkeypatch.setattr(atomic, "_rename_exchange", lambda a, b: errno.EINVAL)
    monkeypatch.setattr(atomic, "_EXCHANGE_SUPPORT", {})
    assert atomic.rename_exchange_supported(tmp_path) is False
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError, match=re.escape(f"{tmp_path / 'missing'}: cannot probe the filesystem for RENAME_EXCHANGE")):
        monkeypatch.setattr(atomic, "_EXCHANGE_SUPPORT", {})
        atomic.rename_exchange_supported(tmp_path / "missing")


@pytest.mark.parametrize("filesystem", ["local", "nfs"])
def test_a_replace_never_leaves_the_directory_missing_or_mixed(tmp_path, monkeypatch, filesystem, request):
    """After every rename, replace and symlink of four commits, a reader finds one whole commit: the previous or the
    new one, never nothing (a crash there would lose the training state) and never files of two commits."""
    if filesystem == "nfs":
        request.getfixturevalue("nfs")
    final = tmp_path / "train_state"
    seen: list[tuple[str, tuple[str, str] | None]] = []

    def observed(call):
        def wrapper(*args, **kwargs):
            result = call(*args, **kwargs)
            seen.append((call.__name__, state(final)))
            return result

        return wrapper

    for name in ("rename", "replace", "symlink"):
        monkeypatch.setattr(os, name, observed(getattr(os, name)))
    for value in "0123":
        before = len(seen)
        commit(final, value)
        for call, now in seen[before:]:
            if value == "0" and now is None:
                continue  # nothing was there before the first commit
            assert now in ((str(int(value) - 1),) * 2, (value, value)), (filesystem, value, call, now, seen[before:])
    assert state(final) == ("3", "3")
    monkeypatch.undo()
    names = sorted(p.name for p in tmp_path.iterdir())
    if filesystem == "nfs":  # the symlink and the one version it points to; the older versions are gone
        assert final.is_symlink() and names == sorted(["train_state", os.readlink(final)])
    else:
        assert names == ["train_state"] and not final.is_symlink()


def test_a_directory_written_before_becomes_a_symlink_once(tmp_path, monkeypatch):
    """A state written where RENAME_EXCHANGE worked (or by the code before) is converted on its first commit on NFS;
    from then on every commit is the symlink's one rename (previous test)."""
    final = tmp_path / "train_state"
    commit(final, "old")
    assert final.is_dir() and not final.is_symlink()
    monkeypatch.setattr(atomic, "_rename_exchange", lambda a, b: errno.EINVAL)
    monkeypatch.setattr(atomic, "_EXCHANGE_SUPPORT", {})
    commit(final, "new")
    assert final.is_symlink() and state(final) == ("new", "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["train_state", os.readlink(final)])


def test_versions_orphaned_by_a_crash_are_removed_after_the_lease(tmp_path, nfs):
    """A writer killed between renaming its version into place and switching the symlink leaves that version; the next
    commit removes it once it is older than the lease, and keeps a fresh one (a writer about to switch)."""
    final = tmp_path / "train_state"
    commit(final, "0")
    dead, fresh = tmp_path / ".train_state.v~dead", tmp_path / ".train_state.v~fresh"
    dead.mkdir()
    fresh.mkdir()
    old = time.time() - atomic.lease_seconds() - 60
    os.utime(dead, (old, old))
    commit(final, "1")
    names = {p.name for p in tmp_path.iterdir()}
    assert dead.name not in names and fresh.name in names and state(final) == ("1", "1")


CRASHING_WRITER = """
import errno, sys
from pathlib import Path
from alpha_core import atomic
atomic._rename_exchange = lambda a, b: errno.EINVAL  # the output volume is NFS
final = Path(sys.argv[1])
for value in sys.argv[2:]:
    with atomic.atomic_directory(final, replace=True) as tmp:
        (tmp / "a").write_text(value)
        (tmp / "b").write_text(value)
"""


@pytest.mark.parametrize(("point", "survivor"), [("tmp.before_commit", "old"), ("tmp.after_commit", "new")])
def test_a_writer_killed_at_a_commit_point_on_nfs_leaves_the_old_or_the_new_state(tmp_path, point, survivor):
    """SIGKILL (ALPHA_FAULT) at the second commit's kill points: the state is whole, and a later writer commits over it."""
    final = tmp_path / "train_state"
    env = {**os.environ, "ALPHA_FAULT": f"{point}#2", "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, str(final), "old", "new"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert final.is_symlink() and state(final) == (survivor, survivor)
    env.pop("ALPHA_FAULT")
    run = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, str(final), "later"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert state(final) == ("later", "later")
