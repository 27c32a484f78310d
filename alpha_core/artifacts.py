"""Training attempts: immutable units that become visible only by promotion.

A trained unit (one fold's checkpoint folder) is never written where readers look. Each attempt writes into its
own folder `.{dest}.attempts/{attempt id}/` (the Dagster run id, or one id per CLI invocation, shared by its
folds), holding the attempt's lock (`alpha_core.locks`: it belongs to the run and step, so a Dagster retry on
another pod takes it over at once) while it writes. It is complete once its `manifest.json` (every file's size
and sha256) is written, the last step, and only by the lock's current holder. Only a complete attempt can be
promoted: `dest` becomes a relative symlink to it, swapped in one atomic rename. So a crashed, concurrent or
gate-failed attempt never changes what `dest` shows, and readers can verify that a unit's files are exactly
those it was completed with. The folds of one CLI run are promoted together, after the last one completed
(`promote_all`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from alpha_core.atomic import atomic_write_json, temporary_name
from alpha_core.errors import PlanError
from alpha_core.faults import crash_point
from alpha_core.hashing import file_sha256
from alpha_core.locks import BROKEN, Lock

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
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and p.name not in (MANIFEST, LOCK) and ".tmp~" not in str(p) and BROKEN not in p.name
    )


@contextmanager
def writing(attempt: Attempt, retry: bool = False) -> Iterator[Lock]:
    """Hold the attempt's lock while the block writes into it. A second live writer fails fast naming the holder;
    with `retry` (the orchestrator retrying this very step) the attempt is taken over at once."""
    attempt.path.mkdir(parents=True, exist_ok=True)
    with Lock(attempt.path / LOCK, run=attempt.id, step=str(attempt.dest)).hold(takeover_same_step=retry) as lock:
        yield lock


def complete(attempt: Attempt, lock: Lock) -> None:
    """Seal the attempt: the manifest of every file it holds, written last and atomically, by the lock's holder."""
    crash_point("attempt.before_complete")
    lock.check()
    seal(attempt.path, attempt.id)


def seal(folder: Path, attempt_id: str) -> None:
    """Write `folder`'s manifest: every file with its size and sha256 (what `verify` checks)."""
    files = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in _files(folder)}
    atomic_write_json(
        folder / MANIFEST, {"attempt": attempt_id, "completed": dt.datetime.now(dt.UTC).isoformat(), "files": files}
    )


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


def attempts(dest: Path) -> list[Attempt]:
    """Every attempt at `dest`, complete or not, the most recently written first."""
    root = attempts_dir(dest)
    if not root.is_dir():
        return []
    found = [Attempt(dest, p.name) for p in root.iterdir() if p.is_dir() and ".tmp~" not in p.name]
    return sorted(found, key=lambda a: a.path.stat().st_mtime, reverse=True)


def promote_all(units: list[Attempt]) -> None:
    """Promote the folds of one run together, once every one of them is complete (none before)."""
    missing = [str(a.path) for a in units if not a.complete]
    if missing:
        raise PlanError(f"not promoting a run with incomplete folds: {', '.join(missing)}")
    for attempt in units:
        promote(attempt)


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


def run_attempt(attempt: Attempt, build: Callable[[Path], T], reuse: Callable[[Path], T], retry: bool = False) -> T:
    """Write `attempt` with `build(folder)` and seal it (not promoted); an attempt that already completed (a retried
    step after a crash) is not rebuilt: `reuse(folder)` reads its result. Leftovers of a crashed try go first."""
    with writing(attempt, retry) as lock:
        if attempt.complete:
            return reuse(attempt.path)
        for leftover in _files(attempt.path):
            leftover.unlink()
        result = build(attempt.path)
        complete(attempt, lock)
    return result
