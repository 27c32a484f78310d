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

Fencing: an attempt is written in generations, one per acquisition. The first writer of attempt `A` writes
`A/`; whoever takes it over (a `--resume`, a Dagster retry, after the first writer crashed, froze or was cut off)
never writes there but creates the next generation `A~g1/` (then `A~g2/` ...) with its own lock inside, in one
rename that fails if another took that number, and copies what the last generation committed (a trainer's
state and checkpoints) before it goes on. The generation number is the writer's fencing token: it only
increases, and a writer may commit only while its generation is the newest and its lock its own
(`Writer.check`, run before every commit under its folder via `alpha_core.atomic.guard`). A frozen writer that
wakes up after a takeover therefore stops at its next commit (`LockLost`: one line, exit 2) and has never
written into its successor's folder. A sealed generation is read-only (its files `a-w`, and no commit goes
into it); a complete one is deep-verified before it is reused or promoted, and a damaged one is rebuilt as a new
generation, never promoted. `Attempt.path` is the newest generation.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from alpha_core.atomic import TMP_MARK, VERSION_MARK, atomic_write_json, guard, temporary_name
from alpha_core.errors import PlanError
from alpha_core.faults import crash_point
from alpha_core.hashing import file_sha256
from alpha_core.locks import BROKEN, Lock, LockLost, is_abandoned, lock_age, read_holder, stale_seconds

T = TypeVar("T")
MANIFEST = "manifest.json"
LOCK = ".lock"
GENERATION = "~g"  # `{id}~g{n}`: the n-th takeover of attempt `id`


def attempts_dir(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.attempts"


def new_attempt_id() -> str:
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def _split(name: str) -> tuple[str, int]:
    """A folder name as (attempt id, generation): `A` is generation 0 of `A`, `A~g3` generation 3."""
    base, mark, n = name.rpartition(GENERATION)
    return (base, int(n)) if mark and n.isdigit() and base else (name, 0)


@dataclass(frozen=True)
class Attempt:
    dest: Path
    id: str

    def generations(self) -> list[tuple[int, Path]]:
        """Every generation's folder, the oldest first."""
        root = attempts_dir(self.dest)
        try:
            names = [p.name for p in root.iterdir() if TMP_MARK not in p.name]
        except FileNotFoundError:
            return []
        found = [(n, root / name) for name in names for base, n in [_split(name)] if base == self.id]
        return sorted(f for f in found if f[1].is_dir())

    @property
    def path(self) -> Path:
        """The newest generation's folder (what a reader, a resume or a promotion means by this attempt)."""
        gens = self.generations()
        return gens[-1][1] if gens else attempts_dir(self.dest) / self.id

    @property
    def complete(self) -> bool:
        return (self.path / MANIFEST).is_file()


class Writer:
    """One acquisition of an attempt: its generation (the fencing token), its folder and its lock."""

    def __init__(self, attempt: Attempt, generation: int, folder: Path, lock: Lock | None) -> None:
        self.attempt, self.generation, self.folder, self.lock = attempt, generation, folder, lock

    @property
    def complete(self) -> bool:
        return (self.folder / MANIFEST).is_file()

    def check(self) -> None:
        """Refuse to write on unless this generation is the newest and its lock still ours (`LockLost`)."""
        newest = self.attempt.generations()
        if newest and newest[-1][0] > self.generation:
            raise LockLost(
                f"{self.folder}: this writer lost its lock: {newest[-1][1].name} took the attempt over "
                f"(generation {newest[-1][0]} > {self.generation}); it stops without writing on"
            )
        if self.lock is not None:
            self.lock.check()


def _files(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and p.name not in (MANIFEST, LOCK) and ".tmp~" not in str(p) and BROKEN not in p.name
    )


def _busy(lock: Path, holder) -> PlanError:
    return PlanError(
        f"{lock.parent} is being written by {holder.describe()}, heartbeat {lock_age(lock) or 0:.0f} s ago "
        f"(lock {lock}); wait for it, or remove the lock if that process is gone (a lock without a heartbeat "
        f"for {stale_seconds():.0f} s is taken over)"
    )


def _inherit(source: Path, target: Path) -> None:
    """Copy what `source` committed into the new generation `target` (copies, never links: the old writer, if it
    ever wakes, must not reach a byte of its successor's files). Temporaries, locks and manifests stay behind.
    Each entry appears whole (copied under a temporary name, then renamed), files first, then folders, then
    symlinks, so the training state (a folder, or a symlink to one) comes last: a copy cut short leaves no state,
    and its resume trains from the start instead of from a state without its checkpoints."""
    entries = [e for e in source.iterdir() if e.name not in (LOCK, MANIFEST) and TMP_MARK not in e.name]
    entries = [e for e in entries if BROKEN not in e.name]
    for entry in sorted(entries, key=lambda e: (e.is_symlink(), e.is_dir(), e.name)):
        tmp = temporary_name(target / entry.name)
        if entry.is_symlink():
            os.symlink(os.readlink(entry), tmp)
        elif entry.is_dir():
            shutil.copytree(entry, tmp, symlinks=True, ignore=shutil.ignore_patterns(f"*{TMP_MARK}*"))
        else:
            shutil.copyfile(entry, tmp)
        os.rename(tmp, target / entry.name)


def _read_only(folder: Path) -> None:
    """A sealed attempt's files lose their write bits (folders keep theirs, so the lock can go and `alpha clean`
    can remove what it must)."""
    for p in folder.rglob("*"):
        if p.is_file() and not p.is_symlink() and p.name != LOCK:
            os.chmod(p, stat.S_IMODE(p.stat().st_mode) & ~0o222)


@contextmanager
def writing(attempt: Attempt, retry: bool = False, inherit: bool = False) -> Iterator[Writer]:
    """Acquire the attempt and hold its lock while the block writes into `writer.folder`.

    The newest generation decides: complete and intact, the block gets it to reuse (`writer.complete`, nothing to
    write); held by a live writer, a PlanError names it (with `retry`, the orchestrator retrying this very step, it
    is taken over at once); otherwise (none yet, abandoned, or complete but damaged) this writer creates the next
    generation with its lock, copying the last one's committed files with `inherit` (a trainer's resumable state).
    """
    step = str(attempt.dest)
    while True:
        gens = attempt.generations()
        source = None
        if gens:
            last, folder = gens[-1]
            if (folder / MANIFEST).is_file():
                problems = verify(folder, deep=True)
                if not problems:
                    yield Writer(attempt, last, folder, None)
                    return
                print(f"{folder}: damaged ({problems[0]}); not reused, rebuilt as a new generation", flush=True)
            else:
                lock_path = folder / LOCK
                holder = read_holder(lock_path) if lock_path.exists() else None
                if holder is not None and not is_abandoned(lock_path, holder, *((attempt.id, step) if retry else ())):
                    raise _busy(lock_path, holder)
                source = folder if inherit else None
            n = last + 1
        else:
            n = 0
        target = attempts_dir(attempt.dest) / (attempt.id if n == 0 else f"{attempt.id}{GENERATION}{n}")
        lock = Lock(target / LOCK, run=attempt.id, step=step, fenced=False)
        tmp = temporary_name(target)
        tmp.mkdir(parents=True)
        try:
            (tmp / LOCK).write_text(json.dumps(lock.me.__dict__))
            crash_point("lock.before_link")
            os.rename(tmp, target)  # fails if another writer took this generation first: judge again
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if target.exists():
                continue
            raise
        lock.held = True
        writer = Writer(attempt, n, target, lock)
        try:
            with lock.hold(), guard(target, writer.check):
                if source is not None:
                    _inherit(source, target)
                    writer.check()
                yield writer
        finally:
            if writer.complete:
                _read_only(target)
        return


def complete(attempt: Attempt, writer: Writer) -> None:
    """Seal the attempt: the manifest of every file it holds, written last and atomically, by the lock's holder."""
    crash_point("attempt.before_complete")
    writer.check()
    seal(writer.folder, attempt.id)


def seal(folder: Path, attempt_id: str) -> None:
    """Write `folder`'s manifest: every file with its size and sha256 (what `verify` checks)."""
    files = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in _files(folder)}
    atomic_write_json(
        folder / MANIFEST, {"attempt": attempt_id, "completed": dt.datetime.now(dt.UTC).isoformat(), "files": files}
    )


def promote(attempt: Attempt) -> None:
    """Point `dest` at a complete attempt, in one atomic rename of a symlink."""
    folder = attempt.path  # one generation, judged and linked
    if not (folder / MANIFEST).is_file():
        raise PlanError(f"{folder}: an incomplete attempt cannot be promoted")
    if problems := verify(folder, deep=True):
        raise PlanError(f"{folder}: a damaged attempt is not promoted ({problems[0]})")
    crash_point("attempt.before_promote")
    dest = attempt.dest
    if dest.exists() and not dest.is_symlink():  # a folder from before attempts existed: keep it as one
        os.rename(dest, attempts_dir(dest) / f"legacy-{new_attempt_id()}")
    link = temporary_name(dest)
    os.symlink(os.path.relpath(folder, dest.parent), link, target_is_directory=True)
    os.replace(link, dest)
    crash_point("attempt.after_promote")


def promoted(dest: Path) -> Attempt | None:
    """The attempt `dest` points at, if it has been promoted."""
    if not dest.is_symlink():
        return None
    return Attempt(dest, _split(Path(os.readlink(dest)).name)[0])


def attempts(dest: Path) -> list[Attempt]:
    """Every attempt at `dest`, complete or not, the most recently written first."""
    root = attempts_dir(dest)
    if not root.is_dir():
        return []
    ids = {_split(p.name)[0] for p in root.iterdir() if p.is_dir() and TMP_MARK not in p.name and VERSION_MARK not in p.name}
    found = [Attempt(dest, i) for i in ids]
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
    step after a crash) is not rebuilt: `reuse(folder)` reads its result. A crashed or taken-over try is rebuilt
    from scratch in a new generation."""
    with writing(attempt, retry) as writer:
        if writer.complete:
            return reuse(writer.folder)
        result = build(writer.folder)
        complete(attempt, writer)
    return result
