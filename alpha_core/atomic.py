"""The commit protocol of every artifact: write beside it under a writer-unique temporary name, fsync, rename.

A file or a directory appears whole or not at all. Temporary names carry their writer's identity
(`.{name}.tmp~{host}~{pid namespace}~{pid}~{random}`), so two writers never share one, and a leftover is
removed only when it is provably abandoned: its writer is a dead process of this host and PID namespace, or
it has not been touched for the lease (`ALPHA_TMP_LEASE_S`, default 15 min). A writer that may take longer
keeps its temporary fresh with a heartbeat, so pods on other hosts sharing the volume never delete it.

A writer that holds a lock registers its fence for the folder it owns (`guard`): every commit below that folder
checks first that the lock is still this writer's, just before the rename that makes the result visible, so a
writer that lost its lock stops at its next commit. A sealed attempt (a folder of an `.attempts` directory with a
`manifest.json`) is read-only: no commit goes into it.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from alpha_core.faults import crash_point

TMP_MARK = ".tmp~"


def lease_seconds() -> float:
    return float(os.environ.get("ALPHA_TMP_LEASE_S", "900"))


_GUARDS: dict[Path, list[Callable[[], None]]] = {}  # folder -> the fence checks of its writers in this process
_GUARDS_LOCK = threading.Lock()
SEALED_MANIFEST = "manifest.json"


@contextmanager
def guard(folder: Path, check: Callable[[], None]) -> Iterator[None]:
    """While the block runs, every commit under `folder` (itself included) calls `check` first (a lock's fence)."""
    folder = Path(os.path.abspath(folder))
    with _GUARDS_LOCK:
        _GUARDS.setdefault(folder, []).append(check)
    try:
        yield
    finally:
        with _GUARDS_LOCK:
            _GUARDS[folder].remove(check)
            if not _GUARDS[folder]:
                del _GUARDS[folder]


def check_writable(path: Path) -> None:
    """Raise unless this process may still commit `path`: each guard of a folder holding it passes, and no sealed
    attempt holds it (`PermissionError` naming the attempt)."""
    path = Path(os.path.abspath(path))
    with _GUARDS_LOCK:
        checks = [c for folder, cs in _GUARDS.items() if path == folder or path.is_relative_to(folder) for c in cs]
    for check in checks:
        check()
    for folder in path.parents:
        if folder.parent.name.endswith(".attempts"):
            if (folder / SEALED_MANIFEST).is_file():
                raise PermissionError(errno.EACCES, f"{folder} is a sealed attempt, read-only: {path} is not written")
            break


def fs_now(directory: Path) -> float:
    """The current time by `directory`'s filesystem: the mtime of a file just created there (the server's clock on
    NFS, as heartbeats `utime(NULL)` use), so ages of files on a shared volume never depend on this host's clock.
    This host's clock where nothing can be created there (a read-only volume)."""
    probe = temporary_name(Path(directory) / "clock")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return time.time()
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        with suppress(OSError):
            os.unlink(probe)


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def owner_tag() -> str:
    """This process as `host~pidns~pid` (`~` never occurs in a host name)."""
    host = socket.gethostname().replace("~", "-").replace("/", "-") or "unknown"
    return f"{host}~{_pid_namespace()}~{os.getpid()}"


def owner_is_dead(tag: str) -> bool:
    """True only when `tag` is a process of this host and PID namespace that no longer exists."""
    try:
        host, pidns, pid = tag.rsplit("~", 2)
        pid_n = int(pid)
    except ValueError:
        return False
    here_host, here_ns, _ = owner_tag().rsplit("~", 2)
    if (host, pidns) != (here_host, here_ns):
        return False  # another machine or container: its PIDs mean nothing here, only the lease can tell
    if pid_n == os.getpid():
        return False
    try:
        os.kill(pid_n, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def temporary_name(final: Path) -> Path:
    return final.with_name(f".{final.name}{TMP_MARK}{owner_tag()}~{secrets.token_hex(4)}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            _fsync(Path(dirpath, name))
        _fsync(Path(dirpath))


@contextmanager
def heartbeat(path: Path) -> Iterator[None]:
    """Touch `path` every quarter lease while the block runs, so no other host takes it for abandoned."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(lease_seconds() / 4):
            try:
                os.utime(path)
            except OSError:
                return

    thread = threading.Thread(target=beat, name="alpha-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write `path` through; on success it is fsynced and renamed into place."""
    path = Path(path)
    check_writable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        yield tmp
        _fsync(tmp)
        crash_point("tmp.before_commit", path.name)
        check_writable(path)
        os.replace(tmp, path)
        crash_point("tmp.after_commit")
        _fsync(path.parent)
    except OSError as exc:
        if exc.errno is not None and exc.filename in (None, str(tmp)):  # a failed write() names no file: the output
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return path


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


@contextmanager
def atomic_directory(final: Path, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it is fsynced and renamed to `final` in one step.

    Without `replace`, raises FileExistsError if `final` appeared meanwhile (another writer won). With
    `replace`, an existing `final` is swapped out in one step and then removed: by `renameat2(RENAME_EXCHANGE)`
    where the filesystem has it, otherwise (NFS) `final` is a symlink to a versioned sibling and the swap is an
    `os.replace` of that symlink (`_switch_link`), atomic on every POSIX filesystem. Readers see either the old
    or the new directory, never neither. The temporary is removed on failure either way.
    """
    check_writable(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(final)
    tmp.mkdir()
    try:
        with heartbeat(tmp):
            yield tmp
        _fsync_tree(tmp)
        crash_point("tmp.before_commit", final.name)
        check_writable(final)
        if replace and (final.is_symlink() or not rename_exchange_supported(final.parent)):
            _switch_link(tmp, final)
        elif replace and final.exists():
            _exchange(tmp, final)  # tmp now holds the old contents
        else:
            try:
                os.rename(tmp, final)
            except OSError as exc:
                if final.exists():
                    raise FileExistsError(final) from exc
                raise
        crash_point("tmp.after_commit")
        _fsync(final.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


VERSION_MARK = ".v~"  # `.{name}.v~{token}`: a committed version behind the symlink `name` (never a temporary)
_EXCHANGE_SUPPORT: dict[int, bool] = {}  # st_dev -> whether renameat2(RENAME_EXCHANGE) works there


def _rename_exchange(a: Path, b: Path) -> int:
    """renameat2(a, b, RENAME_EXCHANGE): 0, or the errno (EINVAL on NFS, ENOSYS without the call)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, rename_exchange = -100, 2
        if libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
            return 0
        return ctypes.get_errno() or errno.EINVAL
    except (AttributeError, OSError):
        return errno.ENOSYS


def rename_exchange_supported(directory: Path) -> bool:
    """Probe (once per filesystem) whether two entries of `directory` can be swapped in one step.

    NFS, CephFS and most FUSE filesystems answer EINVAL: there `atomic_directory(replace=True)` commits through a
    symlink instead. Any other failure of the probe itself (a full disk, no permission) is raised, naming the path.
    """
    directory = Path(directory)
    try:
        device = directory.stat().st_dev
        if device not in _EXCHANGE_SUPPORT:
            a, b = temporary_name(directory / "exchange-probe-a"), temporary_name(directory / "exchange-probe-b")
            try:
                a.mkdir()
                b.symlink_to(a.name)
                _EXCHANGE_SUPPORT[device] = _rename_exchange(a, b) == 0 and a.is_symlink() and not b.is_symlink()
            finally:
                for p in (a, b):
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    except OSError as exc:
        raise OSError(exc.errno, f"{directory}: cannot probe the filesystem for RENAME_EXCHANGE: {exc.strerror}") from None
    return _EXCHANGE_SUPPORT[device]


def _exchange(a: Path, b: Path) -> None:
    """Swap two entries atomically (renameat2); without it, move `b` aside first: a short window in which `b`
    is missing, taken only once per directory written before the symlink commit existed."""
    if _rename_exchange(a, b) == 0:
        return
    aside = temporary_name(b)
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def _switch_link(tmp: Path, final: Path) -> None:
    """Commit `tmp` as `final` without RENAME_EXCHANGE: `final` is a relative symlink to `.{name}.v~{token}`,
    replaced by one `os.replace`, then the version it pointed to is removed. Versions left by a crash between
    the rename and the switch are removed once they are older than the lease."""
    version = final.with_name(f".{final.name}{VERSION_MARK}{secrets.token_hex(6)}")
    os.rename(tmp, version)
    link = temporary_name(final)
    try:
        os.symlink(version.name, link, target_is_directory=True)
        old = os.readlink(final) if final.is_symlink() else None
        if final.exists() and old is None:  # a directory from before: one exchange (atomic where the call exists)
            _exchange(link, final)
            shutil.rmtree(link, ignore_errors=True)  # link now names the old directory
        else:
            os.replace(link, final)
    except BaseException:
        link.unlink(missing_ok=True)
        shutil.rmtree(version, ignore_errors=True)
        raise
    now = fs_now(final.parent)
    for sibling in final.parent.glob(f".{final.name}{VERSION_MARK}*"):
        if sibling.name == version.name:
            continue
        try:
            stale = sibling.name == old or now - sibling.lstat().st_mtime > lease_seconds()
        except FileNotFoundError:
            continue
        if stale:
            shutil.rmtree(sibling, ignore_errors=True)


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Remove temporaries whose writer is provably gone (dead local process, or lease expired)."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    now = fs_now(directory)
    for p in directory.iterdir():
        if TMP_MARK not in p.name:
            continue
        owner = p.name.split(TMP_MARK, 1)[1].rsplit("~", 1)[0]
        try:
            age = now - p.lstat().st_mtime
        except FileNotFoundError:
            continue
        if owner_is_dead(owner) or age > lease_seconds():
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
            removed.append(p)
    return removed
