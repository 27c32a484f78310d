"""`alpha clean`: remove what crashed writers left behind, never what a live writer holds.

Under a storage root (and, for hyperopt trials, the temp dir):
- temporaries (`.<name>.tmp~<owner>~...`, `alpha_core.atomic`) whose writer is a dead process of this host or
  that have not been touched for the lease (`ALPHA_TMP_LEASE_S`);
- locks that may be taken over (`alpha_core.locks.is_abandoned`: a dead local owner, a stale heartbeat, an
  unreadable lock) and the leftovers of breaking one;
- attempts that never completed (no manifest), hold no live lock and were last written more than
  `older_than_s` ago (a week by default: an unfinished attempt is what `alpha train --resume` continues);
- hyperopt trial folders (`alpha-trial-<owner>~...` in the temp dir) of dead or silent processes.

Complete attempts stay, promoted or not: an unpromoted one is the evidence of a failed gate. The Dagster job
`storage_cleanup` runs the same function on a daily schedule.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from alpha_core.atomic import TMP_MARK, lease_seconds, owner_is_dead
from alpha_core.locks import BROKEN, is_abandoned, read_holder

TRIAL_PREFIX = "alpha-trial-"
ATTEMPTS_SUFFIX = ".attempts"
LOCK = ".lock"
MANIFEST = "manifest.json"
WEEK_S = 7 * 86_400


@dataclass(frozen=True)
class Removal:
    path: Path
    reason: str


def _age(path: Path) -> float:
    return time.time() - path.lstat().st_mtime


def _newest_write(folder: Path) -> float:
    """Seconds since anything under `folder` was last written."""
    newest = folder.lstat().st_mtime
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in (*dirnames, *filenames):
            newest = max(newest, (Path(dirpath) / name).lstat().st_mtime)
    return time.time() - newest


def _temporary_owner(name: str, prefix: str) -> str:
    """`host~pidns~pid` from a temporary's name: `<prefix><owner>~<random>`."""
    return name.split(prefix, 1)[1].rsplit("~", 1)[0]


def stale(root: Path, older_than_s: float = WEEK_S) -> list[Removal]:
    """Everything under `root` that `clean` would remove, with the reason."""
    found: list[Removal] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in [*dirnames, *filenames]:
            path = here / name
            if TMP_MARK in name:
                owner = _temporary_owner(name, TMP_MARK)
                if owner_is_dead(owner):
                    found.append(Removal(path, f"temporary of the dead process {owner}"))
                elif _age(path) > lease_seconds():
                    found.append(Removal(path, f"temporary untouched for {_age(path):.0f} s"))
            elif BROKEN in name:
                found.append(Removal(path, "left over from breaking a lock"))
            elif name.endswith(LOCK) and name in filenames and is_abandoned(path, read_holder(path)):
                found.append(Removal(path, "abandoned lock"))
        dirnames[:] = [d for d in dirnames if TMP_MARK not in d]
        if here.name.endswith(ATTEMPTS_SUFFIX):
            dirnames[:] = []  # attempts are judged whole, below
            for attempt in sorted(p for p in here.iterdir() if p.is_dir() and TMP_MARK not in p.name):
                found += _attempt(attempt, older_than_s)
    return found


def _attempt(attempt: Path, older_than_s: float) -> list[Removal]:
    lock = attempt / LOCK
    live = lock.exists() and not is_abandoned(lock, read_holder(lock))
    if live:
        return []
    if (attempt / MANIFEST).is_file():
        return [Removal(lock, "abandoned lock of a complete attempt")] if lock.exists() else []
    idle = _newest_write(attempt)
    if idle > older_than_s:
        return [Removal(attempt, f"incomplete attempt, no live writer, untouched for {idle / 86_400:.1f} days")]
    return [Removal(lock, "abandoned lock (the attempt stays: --resume continues it)")] if lock.exists() else []


def stale_trials(tmp: Path | None = None) -> list[Removal]:
    """Hyperopt trial folders in the temp dir whose process is gone."""
    tmp = Path(tmp or tempfile.gettempdir())
    found = []
    for path in tmp.glob(f"{TRIAL_PREFIX}*"):
        owner = _temporary_owner(path.name, TRIAL_PREFIX)
        if owner_is_dead(owner) or _age(path) > lease_seconds():
            found.append(Removal(path, f"hyperopt trial of the gone process {owner}"))
    return found


def clean(roots: list[Path], older_than_s: float = WEEK_S, dry_run: bool = False, tmp: Path | None = None) -> list[Removal]:
    """Remove (unless `dry_run`) and return what crashed writers left under `roots` and in the temp dir."""
    found = [r for root in roots if Path(root).is_dir() for r in stale(Path(root), older_than_s)]
    found += stale_trials(tmp)
    if not dry_run:
        for removal in found:
            if removal.path.is_dir() and not removal.path.is_symlink():
                shutil.rmtree(removal.path, ignore_errors=True)
            else:
                removal.path.unlink(missing_ok=True)
    return found
