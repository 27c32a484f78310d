"""Training attempts: immutable units that become visible only by promotion.

A trained unit (one fold's checkpoint folder, or `alpha train --out`) is never written where readers look.
Each attempt writes into its own folder `.{dest}.attempts/{attempt id}/` (the Dagster run id, or a fresh id in
the CLI), holding a lock with its owner while it writes. It is complete once its `manifest.json` (every file's
size and sha256) is written, the last step. Only a complete attempt can be promoted: `dest` becomes a
relative symlink to it, swapped in one atomic rename. So a crashed, concurrent or gate-failed attempt never
changes what `dest` shows, and readers can verify that a unit's files are exactly those it was completed with.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from alpha_core.atomic import atomic_write_json, heartbeat, lease_seconds, owner_is_dead, owner_tag, temporary_name
from alpha_core.errors import PlanError
from alpha_core.faults import crash_point
from alpha_core.hashing import file_sha256

T = TypeVar("T")
MANIFEST = "manifest.json"
LOCK = ".lock"


def attempts_dir(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.attempts"


def new_attempt_id() -> str:
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Attempt:
    dest: Path
    id: str

    @property
    def path(self) -> Path:
        return attempts_dir(self.dest) / self.id

    @property
    def complete(self) -> bool:
        return (self.path / MANIFEST).is_file()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name not in (MANIFEST, LOCK) and ".tmp~" not in str(p))


@contextmanager
def writing(attempt: Attempt) -> Iterator[Path]:
    """Hold the attempt's lock while the block writes into it; a second writer fails fast naming the owner."""
    attempt.path.mkdir(parents=True, exist_ok=True)
    lock = attempt.path / LOCK
    owner = {"owner": owner_tag(), "since": dt.datetime.now(dt.UTC).isoformat()}
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            _break_stale_lock(lock)
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(owner, fh)
        break
    else:
        held = _read_lock(lock)
        raise PlanError(f"{attempt.path} is being written by {held.get('owner', '?')} since {held.get('since', '?')} "
                        f"(lock {lock}); wait for it, or remove the lock if that process is gone")
    try:
        with heartbeat(lock):
            yield attempt.path
    finally:
        lock.unlink(missing_ok=True)


def _read_lock(lock: Path) -> dict:
    try:
        return json.loads(lock.read_text())
    except (OSError, ValueError):
        return {}


def _break_stale_lock(lock: Path) -> None:
    """Remove a lock whose owner is provably gone (dead local process, or no heartbeat for the lease)."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if owner_is_dead(_read_lock(lock).get("owner", "")) or age > lease_seconds():
        lock.unlink(missing_ok=True)


def complete(attempt: Attempt) -> None:
    """Seal the attempt: the manifest of every file it holds, written last and atomically."""
    crash_point("attempt.before_complete")
    seal(attempt.path, attempt.id)


def seal(folder: Path, attempt_id: str) -> None:
    """Write `folder`'s manifest: every file with its size and sha256 (what `verify` checks)."""
    files = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in _files(folder)}
    atomic_write_json(folder / MANIFEST, {"attempt": attempt_id, "completed": dt.datetime.now(dt.UTC).isoformat(),
                                          "files": files})


def promote(attempt: Attempt) -> None:
    """Point `dest` at a complete attempt, in one atomic rename of a symlink."""
    if not attempt.complete:
        raise PlanError(f"{attempt.path}: an incomplete attempt cannot be promoted")
    crash_point("attempt.before_promote")
    dest = attempt.dest
    if dest.exists() and not dest.is_symlink():  # a folder from before attempts existed: keep it as one
        os.rename(dest, attempts_dir(dest) / f"legacy-{new_attempt_id()}")
    link = temporary_name(dest)
    os.symlink(os.path.relpath(attempt.path, dest.parent), link, target_is_directory=True)
    os.replace(link, dest)
    crash_point("attempt.after_promote")


def promoted(dest: Path) -> Attempt | None:
    """The attempt `dest` points at, if it has been promoted."""
    if not dest.is_symlink():
        return None
    return Attempt(dest, Path(os.readlink(dest)).name)


def latest_incomplete(dest: Path) -> Attempt | None:
    """The most recently written attempt that never completed (what `--resume` continues)."""
    root = attempts_dir(dest)
    if not root.is_dir():
        return None
    candidates = [Attempt(dest, p.name) for p in root.iterdir() if p.is_dir() and ".tmp~" not in p.name]
    candidates = [a for a in candidates if not a.complete]
    return max(candidates, key=lambda a: a.path.stat().st_mtime, default=None)


def verify(path: Path, deep: bool = False) -> list[str]:
    """Problems with a unit: no manifest, a file missing, changed or not in it (checksums with `deep`)."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError):
        return [f"{path}: incomplete (no valid {MANIFEST}): a crashed or unfinished attempt"]
    problems = []
    for name, entry in manifest.items():
        f = path / name
        if not f.is_file():
            problems.append(f"{f}: missing")
        elif f.stat().st_size != entry["size"] or (deep and file_sha256(f) != entry["sha256"]):
            problems.append(f"{f}: changed since the attempt completed")
    extra = [str(p.relative_to(path)) for p in _files(path) if str(p.relative_to(path)) not in manifest]
    problems += [f"{path / name}: not part of the completed attempt" for name in extra]
    return problems


def run_attempt(dest: Path, attempt_id: str | None, build: Callable[[Path], T], reuse: Callable[[Path], T],
                promote_when_done: bool = True) -> T:
    """Write one attempt at `dest` with `build(folder)` and seal it; an attempt that already completed (a retried
    step after a crash) is not rebuilt: `reuse(folder)` reads its result. Leftovers of a crashed try go first."""
    attempt = Attempt(dest, attempt_id or new_attempt_id())
    with writing(attempt) as folder:
        if attempt.complete:
            result = reuse(folder)
        else:
            for leftover in _files(folder):
                leftover.unlink()
            result = build(folder)
            complete(attempt)
    if promote_when_done:
        promote(attempt)
    return result
