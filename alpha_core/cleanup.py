"""`alpha clean`: remove what crashed writers left behind, never what a live writer holds, never what alpha did not write.

Only a storage root is cleaned: a folder holding `.alpha-storage` (`mark_storage_root`), which alpha writes in
every storage root and output folder it writes into (Dagster's storage root, `$ALPHA_STORAGE_ROOT`, a command's
`--out`/`--output-dir`/`--predecoded-dir`). Anything else (a home directory, a source checkout) is refused whole.
Under a storage root, things are recognised by their own format and name, never by a suffix alone:

- temporaries named as `alpha_core.atomic.temporary_name` names them (`.<name>.tmp~<host>~<pidns>~<pid>~<8 hex>`)
  whose writer is a dead process of this host or that have not been touched for the lease (`ALPHA_TMP_LEASE_S`),
  also inside complete attempts;
- locks: a `*.lock` file is a lock only when `alpha_core.locks.read_holder` parses it as one (a uv.lock, yarn.lock or
  flake.lock is not); it goes when it may be taken over (`is_abandoned`: a dead local owner, a stale heartbeat);
  the leftovers of breaking one (`<lock>.broken~<8 hex>`) go when they hold a lock too;
- attempts (folders in a `.<dest>.attempts` folder) that never completed (no manifest), hold no live lock and were
  last written more than `older_than_s` ago (a week by default: an unfinished attempt is what `--resume` continues);
- hyperopt trial folders (`alpha-trial-<owner>~...` in the temp dir) of dead or silent processes.

Complete attempts stay, promoted or not: an unpromoted one is the evidence of a failed gate. The Dagster job
`storage_cleanup` runs the same function on a daily schedule.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from alpha_core.atomic import TMP_MARK, atomic_write_json, lease_seconds, owner_is_dead
from alpha_core.errors import DataError
from alpha_core.locks import BROKEN, Holder, is_abandoned, read_holder
from alpha_core.storage import STORAGE_MARKER

TRIAL_PREFIX = "alpha-trial-"
LOCK = ".lock"
MANIFEST = "manifest.json"
WEEK_S = 7 * 86_400
OWNER = r"[^~/]+~\d+~\d+"  # host~pidns~pid (`alpha_core.atomic.owner_tag`)
TEMPORARY_RE = re.compile(rf"\..+{re.escape(TMP_MARK)}(?P<owner>{OWNER})~[0-9a-f]{{8}}")
BROKEN_RE = re.compile(rf".+{re.escape(LOCK)}{re.escape(BROKEN)}[0-9a-f]{{8}}")
ATTEMPTS_RE = re.compile(r"\..+\.attempts")  # `alpha_core.artifacts.attempts_dir`
TRIAL_RE = re.compile(rf"{TRIAL_PREFIX}(?P<owner>{OWNER})~.+")


@dataclass(frozen=True)
class Removal:
    path: Path
    reason: str


def mark_storage_root(root: str | Path) -> None:
    """Write `root`'s marker (once): the folder is alpha's to clean. The folder is created if needed."""
    marker = Path(root) / STORAGE_MARKER
    if not marker.is_file():
        atomic_write_json(marker, {"written_by": "alpha", "since": dt.datetime.now(dt.UTC).isoformat()})


def is_storage_root(root: Path) -> bool:
    try:
        return isinstance(json.loads((root / STORAGE_MARKER).read_text()), dict)
    except (OSError, ValueError):
        return False


def check_storage_root(root: Path) -> None:
    """Refuse a folder alpha did not write as a storage root (an empty or missing one has nothing to clean)."""
    if root.is_dir() and not is_storage_root(root) and any(root.iterdir()):
        raise DataError(
            root,
            f"not an alpha storage root (no {STORAGE_MARKER}, which alpha writes in every storage root and output "
            "folder it writes into); nothing removed",
        )


def _age(path: Path) -> float:
    return time.time() - path.lstat().st_mtime


def _newest_write(folder: Path) -> float:
    """Seconds since anything under `folder` was last written."""
    newest = folder.lstat().st_mtime
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in (*dirnames, *filenames):
            newest = max(newest, (Path(dirpath) / name).lstat().st_mtime)
    return time.time() - newest


def alpha_lock(path: Path, suffix: bool = True) -> Holder | None:
    """The holder when `path` is a lock file of alpha's format (`locks.read_holder`, its owner a process tag)."""
    if (suffix and not path.name.endswith(LOCK)) or path.is_symlink() or not path.is_file():
        return None
    holder = read_holder(path)
    return holder if holder is not None and re.fullmatch(OWNER, holder.owner) else None


def _temporary(path: Path) -> Removal | None:
    """A removal when `path` is an alpha temporary whose writer is provably gone."""
    match = TEMPORARY_RE.fullmatch(path.name)
    if match is None:
        return None
    if owner_is_dead(owner := match["owner"]):
        return Removal(path, f"temporary of the dead process {owner}")
    if (age := _age(path)) > lease_seconds():
        return Removal(path, f"temporary untouched for {age:.0f} s")
    return None


def _leftovers(folder: Path, older_than_s: float | None) -> list[Removal]:
    """Dead writers' temporaries, abandoned locks and broken-lock leftovers under `folder`; attempts are judged
    whole (`_attempt`), unless `older_than_s` is None (inside one)."""
    found: list[Removal] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        for name in [*dirnames, *filenames]:
            path = here / name
            if (removal := _temporary(path)) is not None:
                found.append(removal)
            elif name in filenames and BROKEN_RE.fullmatch(name):
                if alpha_lock(path, suffix=False) is not None:  # a lock moved aside by its breaker, who then died
                    found.append(Removal(path, "left over from breaking a lock"))
            elif name in filenames and (holder := alpha_lock(path)) is not None and is_abandoned(path, holder):
                found.append(Removal(path, "abandoned lock"))
        dirnames[:] = [d for d in dirnames if not TEMPORARY_RE.fullmatch(d)]  # a temporary goes whole, or stays
        if older_than_s is not None and ATTEMPTS_RE.fullmatch(here.name):
            dirnames[:] = []  # attempts are judged whole, below
            for attempt in sorted(p for p in here.iterdir() if p.is_dir() and not p.is_symlink()):
                if not TEMPORARY_RE.fullmatch(attempt.name):
                    found += _attempt(attempt, older_than_s)
    return found


def stale(root: Path, older_than_s: float = WEEK_S) -> list[Removal]:
    """Everything under the storage root `root` that `clean` would remove, with the reason."""
    check_storage_root(root)
    return _leftovers(root, older_than_s) if root.is_dir() else []


def _attempt(attempt: Path, older_than_s: float) -> list[Removal]:
    lock = attempt / LOCK
    holder = alpha_lock(lock)
    if holder is not None and not is_abandoned(lock, holder):
        return []  # a live writer's: nothing in it is touched
    inside = [r for r in _leftovers(attempt, None) if r.path != lock]
    if (attempt / MANIFEST).is_file():
        return inside + ([Removal(lock, "abandoned lock of a complete attempt")] if holder is not None else [])
    idle = _newest_write(attempt)
    if idle > older_than_s:
        return [Removal(attempt, f"incomplete attempt, no live writer, untouched for {idle / 86_400:.1f} days")]
    return inside + ([Removal(lock, "abandoned lock (the attempt stays: --resume continues it)")] if holder else [])


def stale_trials(tmp: Path | None = None) -> list[Removal]:
    """Hyperopt trial folders in the temp dir whose process is gone."""
    tmp = Path(tmp or tempfile.gettempdir())
    found = []
    for path in tmp.glob(f"{TRIAL_PREFIX}*"):
        if (match := TRIAL_RE.fullmatch(path.name)) is None or not path.is_dir() or path.is_symlink():
            continue
        owner = match["owner"]
        if owner_is_dead(owner) or _age(path) > lease_seconds():
            found.append(Removal(path, f"hyperopt trial of the gone process {owner}"))
    return found


def clean(roots: list[Path], older_than_s: float = WEEK_S, dry_run: bool = False, tmp: Path | None = None) -> list[Removal]:
    """Remove (unless `dry_run`) and return what crashed writers left under `roots` and in the temp dir; a root
    that is not an alpha storage root is refused (DataError) before anything is removed."""
    roots = [Path(root) for root in roots]
    for root in roots:
        check_storage_root(root)
    found = [r for root in roots if root.is_dir() for r in stale(root, older_than_s)]
    found += stale_trials(tmp)
    if not dry_run:
        for removal in found:
            if removal.path.is_dir() and not removal.path.is_symlink():
                shutil.rmtree(removal.path, ignore_errors=True)
            else:
                removal.path.unlink(missing_ok=True)
    return found
