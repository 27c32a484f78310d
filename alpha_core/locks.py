"""Exclusive locks on shared storage that belong to a (run, step), not to a process.

A lock is a small JSON file: who holds it (`run` and `step`, what the orchestrator knows, and `owner`, the
process as host~pidns~pid) and since when. It is created whole or not at all (written beside it, then
hard-linked into place, which fails if a lock exists), so no reader ever sees an empty or half-written lock.
Its holder touches it every `heartbeat_seconds()`; a lock is taken over, and never otherwise:

- at once by a retry of the same run and step (a Dagster step retried on another pod: the orchestrator has
  declared the first try dead, wherever it ran);
- at once when its owner is a dead process of this host and PID namespace;
- when its heartbeat is older than `stale_seconds()` (a minute by default: the holder vanished on another host,
  or is frozen: SIGSTOP, a long GC pause, a preempted VM). The age is the filesystem's own: the lock's mtime
  against that of a file just created beside it (`fs_now`), both stamped by the file server (a heartbeat is
  `utime(NULL)`), so no host's wall clock is ever compared with another's and a skewed clock takes nothing;
- at once when it cannot be read (a lock from before locks were written whole).

Breaking is race-free: the breaker renames the lock aside under a unique name, checks that what it moved is the
lock it judged (otherwise it puts it back), then creates its own.

Fencing: each acquisition also takes the next number of the lock's counter (`<lock>.fence`, bumped by the new
holder only), so the tokens of holders that overlap (a frozen one and its successor) only increase; the last
release removes it. A holder that lost its lock (a zombie writer, back after a takeover) finds
out at `Lock.check`: the lock names another token, or the counter moved past its own. Every commit of a fenced
writer calls it (`alpha_core.atomic.guard`), so a zombie's first write after it wakes raises `LockLost` (one line,
exit 2) instead of changing what its successor wrote.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from alpha_core.atomic import fs_now, owner_is_dead, owner_tag, temporary_name
from alpha_core.errors import PlanError
from alpha_core.faults import crash_point

BROKEN = ".broken~"  # a lock being broken, under a unique name (removed by its breaker, or by `alpha clean`)
FENCE = ".fence"  # `<lock>.fence`: the lock's counter, the last token handed out


class LockLost(PlanError):
    """This writer's lock was taken over (it was frozen or cut off past the staleness): it must not write on."""


def heartbeat_seconds() -> float:
    return float(os.environ.get("ALPHA_LOCK_HEARTBEAT_S", "10"))


def stale_seconds() -> float:
    return 6 * heartbeat_seconds()


@dataclass(frozen=True)
class Holder:
    """What a lock says about its holder."""

    run: str
    step: str
    owner: str  # host~pidns~pid
    token: str  # unique per acquisition: tells a lock from its successor
    since: str = ""
    fence: int = 0  # the acquisition's number from the lock's counter (0: not fenced)

    def describe(self) -> str:
        return f"{self.owner} (run {self.run}, step {self.step}) since {self.since or '?'}"


def read_holder(lock: Path) -> Holder | None:
    """The lock's holder; None when the file is unreadable or not a lock (treated as abandoned)."""
    try:
        data = json.loads(lock.read_text())
        return Holder(
            run=str(data["run"]),
            step=str(data["step"]),
            owner=str(data["owner"]),
            token=str(data["token"]),
            since=str(data.get("since", "")),
            fence=int(data.get("fence", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lock_age(lock: Path) -> float | None:
    """Seconds since the lock's last heartbeat, by the filesystem's clock (see the module docstring)."""
    try:
        mtime = lock.stat().st_mtime
    except FileNotFoundError:
        return None
    return fs_now(lock.parent) - mtime


def read_fence(lock: Path) -> int:
    """The last token the lock's counter handed out (0 before the first)."""
    try:
        return int(lock.with_name(lock.name + FENCE).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def is_abandoned(lock: Path, holder: Holder | None, run: str | None = None, step: str | None = None) -> bool:
    """Whether `lock` may be taken over (by the retry `run`/`step`, when given): see the module docstring."""
    if holder is None:
        return True
    if run is not None and (holder.run, holder.step) == (run, step):
        return True
    if owner_is_dead(holder.owner):
        return True
    age = lock_age(lock)
    return age is not None and age > stale_seconds()


class Lock:
    """One acquisition of a lock file; use `hold` (acquire, heartbeat, release)."""

    def __init__(self, path: Path, run: str, step: str, fenced: bool = True) -> None:
        self.path, self.run, self.step, self.fenced = Path(path), run, step, fenced
        self.me = Holder(
            run=run, step=step, owner=owner_tag(), token=secrets.token_hex(8), since=dt.datetime.now(dt.UTC).isoformat()
        )
        self.held = False

    def _take_fence(self) -> None:
        """Bump the lock's counter (only a holder does) and write the number into the lock: this acquisition's
        token. Two writers never both pass `check` with one number: one of them no longer holds the lock."""
        n = read_fence(self.path) + 1
        self.me = Holder(**{**self.me.__dict__, "fence": n})
        counter = self.path.with_name(self.path.name + FENCE)
        for path, text in ((counter, f"{n}\n"), (self.path, json.dumps(self.me.__dict__))):
            tmp = temporary_name(path)  # whole or not at all, without a commit point of its own
            try:
                tmp.write_text(text)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)

    def _create(self) -> bool:
        """Create the lock with its content in one step; False if a lock exists."""
        tmp = temporary_name(self.path)
        tmp.write_text(json.dumps(self.me.__dict__))
        try:
            crash_point("lock.before_link")
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _break(self, judged: Holder | None) -> None:
        """Move the abandoned lock aside, if it is still the one judged; put back a successor moved by mistake."""
        aside = self.path.with_name(f"{self.path.name}{BROKEN}{secrets.token_hex(4)}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        moved = read_holder(aside)
        if moved != judged and moved is not None:  # a new holder took it between the judgement and the rename
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
        aside.unlink(missing_ok=True)

    def acquire(self, takeover_same_step: bool = False) -> None:
        """Take the lock, breaking an abandoned one; a live holder is a PlanError that names it."""
        holder = self.try_acquire(takeover_same_step)
        if holder is not None:
            age = lock_age(self.path)
            raise PlanError(
                f"{self.path.parent} is being written by {holder.describe()}, heartbeat "
                f"{age or 0:.0f} s ago (lock {self.path}); wait for it, or remove the lock if that "
                f"process is gone (a lock without a heartbeat for {stale_seconds():.0f} s is taken over)"
            )

    def try_acquire(self, takeover_same_step: bool = False) -> Holder | None:
        """Take the lock, breaking an abandoned one: None when taken, else its live holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(8):
            if self._create():
                self.held = True
                if self.fenced:
                    self._take_fence()
                return None
            holder = read_holder(self.path)
            if holder is not None and holder.token == self.me.token:
                self.held = True
                return None
            retry = (self.run, self.step) if takeover_same_step else (None, None)
            if not is_abandoned(self.path, holder, *retry):
                return holder
            self._break(holder)
        raise PlanError(f"{self.path}: could not take the lock (others keep taking it)")

    def check(self) -> None:
        """Refuse to commit if the lock is no longer ours (a retry or a resume took it over): `LockLost`."""
        holder = read_holder(self.path)
        newer = read_fence(self.path) if self.fenced else 0
        if holder is None or holder.token != self.me.token or newer > self.me.fence:
            raise LockLost(
                f"{self.path.parent}: this writer ({self.me.describe()}) lost its lock to "
                f"{holder.describe() if holder and holder.token != self.me.token else 'a newer writer'}"
                f"{f' (token {self.me.fence}, the lock is at {newer})' if newer > self.me.fence else ''}; "
                "it stops without writing on"
            )

    def wait_acquire(self) -> None:
        """Take the lock, waiting while a live holder has it (a stale one is taken over)."""
        while self.try_acquire() is not None:
            time.sleep(max(0.05, min(2.0, heartbeat_seconds() / 2)))

    def release(self) -> None:
        """Remove the lock if it is still ours; its counter goes with it unless a later holder took a number (the
        counter orders holders that overlap, which is all fencing needs, and leaves nothing behind a quiet lock)."""
        self.held = False
        if (holder := read_holder(self.path)) is not None and holder.token == self.me.token:
            if self.fenced and read_fence(self.path) == self.me.fence:
                self.path.with_name(self.path.name + FENCE).unlink(missing_ok=True)
            self.path.unlink(missing_ok=True)

    @contextmanager
    def hold(self, takeover_same_step: bool = False) -> Iterator[Lock]:
        """Acquire (unless `try_acquire` already did), keep the heartbeat while the block runs, release."""
        if not self.held:
            self.acquire(takeover_same_step)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(heartbeat_seconds()):
                holder = read_holder(self.path)
                if holder is None or holder.token != self.me.token:
                    return  # taken over: `check` refuses the commit
                try:
                    os.utime(self.path)
                except OSError:
                    return

        thread = threading.Thread(target=beat, name="alpha-lock", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self.release()
