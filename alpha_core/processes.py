"""Child process groups that stop when asked: SIGTERM to the whole group, then SIGKILL after a grace period.

Dagster's services (`dg dev`, `dagster-daemon run`) map SIGTERM to a graceful shutdown that waits up to 60 s for
each subprocess, and a busy daemon can take that long; a user (or Kubernetes, or a test) asking alpha to stop
expects it to stop within seconds, children included. Every long-lived process alpha starts runs in its own
session (`start_new_session=True`) so that its group holds everything it spawned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

GRACE_S = 8.0  # within the 10 s a stop may take: what a graceful shutdown gets before the group is killed


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> int:
    """Stop `proc` and every process of its group; return its exit status."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return proc.wait()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(proc.pid):
        proc.poll()
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what is left of the group (the leader may be gone already)
    return proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def stop_on_signals():
    """SIGTERM raises KeyboardInterrupt in the main thread, so `finally:` blocks run as for Ctrl-C."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
