"""Where a training process's seconds go, stage by stage (issue 33 item 1): every trainer records them in its
summary (`stage_s`), so one GPU check shows which stage of a fold grew.

The two stages before a trainer starts come from the process itself: `process_start` (exec to the first import of
alpha_core: the interpreter, site, the caller's own imports before ours) and `imports` (from there to the trainer's
clock: torch, numpy, the trainer's modules, argument parsing). Only the first clock of a process carries them; a
second fold trained in the same process starts at its own clock. The rest are timed by the trainer with `stage`
(host wall time; a stage that ends on the host after device work, such as an epoch's loss readback, includes it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

IMPORTED_AT = time.perf_counter()  # this module is imported by alpha_core/__init__.py: alpha_core's first import


def _process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: start time in clock ticks
    except (OSError, ValueError, IndexError):
        return None


_AGE_AT_IMPORT = _process_age_s()
_first_clock_taken = False


class StageClock:
    """Seconds per named stage, summed over repeats (each epoch adds to `epochs`), in the order first seen."""

    def __init__(self) -> None:
        global _first_clock_taken
        self.created = time.perf_counter()
        self.seconds: dict[str, float] = {}
        if not _first_clock_taken:
            _first_clock_taken = True
            if _AGE_AT_IMPORT is not None:
                self.seconds["process_start"] = _AGE_AT_IMPORT
            self.seconds["imports"] = self.created - IMPORTED_AT

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def as_dict(self) -> dict[str, float]:
        """The stages, and `total`: for a process's first clock, the seconds since the process started (what the stages
        leave out is the rest), for a later one the sum of its stages."""
        stages = {k: round(v, 3) for k, v in self.seconds.items()}
        age = _process_age_s() if "process_start" in self.seconds else None
        total = age if age is not None else sum(self.seconds.values())
        return {**stages, "total": round(total, 3)}
