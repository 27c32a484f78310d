"""Fault injection for crash tests: `ALPHA_FAULT=<point>[#<n>]` kills the process at a named commit step.

Every writer of a multi-file artifact calls `crash_point(name)` at the steps where a crash could leave it
half-done (before and after each commit). The tests set `ALPHA_FAULT` to one of `KILL_POINTS`, expect the
process to die by SIGKILL there, and check that a rerun or `--resume` ends exactly like an uninterrupted run.
`#n` kills at the n-th time the point is reached (1-based), e.g. at the second epoch's state commit;
`tmp.before_commit@ensemble_report.json` only at the commit of a file (or folder) of that name.

`stop:<point>[#n]` freezes the process there instead (SIGSTOP, as a node freeze, a long GC pause or a preempted
VM does: its lock heartbeat stops too) until a SIGCONT, and `sleep=<s>:<point>[#n]` sleeps `s` seconds there
(its heartbeat goes on): the fencing tests widen a race at exactly one point with them.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

KILL_POINTS = (
    "tmp.before_commit",  # a file or directory is fully written and fsynced, not yet renamed into place
    "tmp.after_commit",  # renamed into place, the parent directory not yet fsynced
    "state.after_commit",  # a training state is committed, nothing after it has run
    "attempt.before_complete",  # every file of an attempt is written, its manifest is not
    "attempt.before_promote",  # the attempt is complete, not yet promoted
    "attempt.after_promote",
    "report.before_json",  # the report's Markdown and plots are in place, its JSON (the commit point) is not
    "lock.before_link",  # a lock's content is written beside it, not yet linked into place
    "sidecar.locked",  # a sidecar builder holds the sidecar's lock, nothing is written yet
    "hyperopt.before_results",  # every trial of a search has run, its results are not written
)

_hits: Counter[str] = Counter()


def crash_point(name: str, subject: str | None = None) -> None:
    """SIGKILL (or stop, or sleep) this process when `ALPHA_FAULT` names this point (and its hit count).
    `<point>@<file name>` counts only the commits of that file (`subject`, for the `tmp.*` points)."""
    spec = os.environ.get("ALPHA_FAULT")
    if not spec:
        return
    action, _, rest = spec.rpartition(":")
    where, _, nth = rest.partition("#")
    point, _, only = where.partition("@")
    if point != name or (only and only != subject):
        return
    _hits[where] += 1
    if _hits[where] != (int(nth) if nth else 1):
        return
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action.startswith("sleep="):
        time.sleep(float(action.removeprefix("sleep=")))
    else:
        os.kill(os.getpid(), signal.SIGKILL)
