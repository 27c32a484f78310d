"""Write artifacts so a crash never leaves a half file: write to a temporary path, then rename."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TMP_MARK = ".tmp-"


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


@contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it is renamed to `final` in one step.

    Raises FileExistsError if `final` appeared meanwhile (another writer won); the temporary
    directory is removed either way.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
        try:
            os.rename(tmp, final)
        except OSError as exc:
            if final.exists():
                raise FileExistsError(final) from exc
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def remove_dead_temporaries(directory: Path) -> list[Path]:
    """Remove temporaries left by killed writers (their pid is gone); live writers are left alone."""
    removed = []
    if not directory.is_dir():
        return removed
    for p in directory.iterdir():
        if TMP_MARK not in p.name:
            continue
        try:
            pid = int(p.name.split(TMP_MARK, 1)[1].split("-", 1)[0])
        except ValueError:
            continue
        if not _pid_alive(pid):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
