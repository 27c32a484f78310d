"""How many CPUs a process was given, and its torch and BLAS threads set to match.

torch starts one intra-op thread per core it sees, and intra-op threads meet at a barrier in every op. A step that
shares its host with other steps (a local `alpha run` with MAX_PARALLEL > 1), or runs in a pod whose CPU quota is
below the node's core count, then runs more threads than it has CPUs: with several training steps on one host, CPU
time rose 4-11x and epochs took 64-150x the wall time (issue 23). A process's count is the least of

- its cgroup's CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`, the tightest along the
  cgroup's ancestors), rounded down, at least 1;
- its affinity mask (`os.sched_getaffinity`: `taskset`, cpusets);
- ALPHA_CPUS_PER_STEP, the host's share of each step, which a local `alpha run` gives its daemon
  (`local_plan`: the cores over the steps that may run at once).

`apply()` is called once at the start of every training, hyperopt and evaluation entry point.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

from alpha_core.errors import PlanError

ENV = "ALPHA_CPUS_PER_STEP"
_BLAS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _mounts(mountinfo: Path) -> list[tuple[str, Path, str, set[str]]]:
    """(root, mount point, fs type, super options) of each cgroup mount in a /proc/<pid>/mountinfo."""
    out = []
    for line in mountinfo.read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            out.append((fields[3], Path(fields[4]), tail[0], set(tail[2].split(","))))
    return out


def _quota(directory: Path, v2: bool) -> float | None:
    """CPUs allowed by one cgroup directory's own limit; None when it sets none (or the file is absent)."""
    try:
        if v2:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        return None if quota < 0 else quota / int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None


def cgroup_cpu_limit(cgroup: str | Path = "/proc/self/cgroup", mountinfo: str | Path = "/proc/self/mountinfo") -> float | None:
    """The CPU quota of this process's cgroup in CPUs (1.5 = 150 ms per 100 ms), the tightest of the cgroup and
    its ancestors up to the mount, v1 or v2; None without a quota (or where cgroups cannot be read)."""
    try:
        lines = Path(cgroup).read_text().splitlines()
        mounts = _mounts(Path(mountinfo))
    except OSError:
        return None
    limits = []
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        v2 = hid == "0" and controllers == ""
        if not v2 and "cpu" not in controllers.split(","):
            continue
        for root, point, fstype, opts in mounts:
            if (fstype == "cgroup2") != v2 or (not v2 and "cpu" not in opts):
                continue
            rel = os.path.relpath(path, root) if path.startswith(root) else "."  # a namespaced cgroup: the mount
            d = Path(os.path.normpath(point / rel))
            while True:
                q = _quota(d, v2)
                if q is not None:
                    limits.append(q)
                if d == point or point not in d.parents:
                    break
                d = d.parent
    return min(limits) if limits else None


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (taskset, cpuset); the machine's count where the OS has no masks."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def host_share(env: dict[str, str] | None = None) -> int | None:
    """ALPHA_CPUS_PER_STEP: the CPUs of the host a local `alpha run` gives each step; None when unset."""
    raw = (os.environ if env is None else env).get(ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise PlanError(f"{ENV} must be a positive integer (got {raw!r})")
    return int(raw)


def decide(limit: float | None, affinity: int, share: int | None) -> int:
    """The thread count: the least of the quota (rounded down: a thread over the quota is throttled), the affinity
    mask and the host's share; at least 1."""
    n = affinity
    if limit is not None:
        n = min(n, math.floor(limit + 1e-9))
    if share is not None:
        n = min(n, share)
    return max(1, n)


def step_cpus() -> int:
    """The CPUs this process was given (module docstring)."""
    return decide(cgroup_cpu_limit(), affinity_cpus(), host_share())


def apply(n: int | None = None) -> int:
    """Set torch's intra-op (and, while still settable, inter-op) threads and the BLAS/OpenMP pools to this
    process's CPUs (`step_cpus()` unless given), and the thread variables its children inherit. A count already
    set lower on purpose (OMP_NUM_THREADS=1, a test harness) is kept: this only ever lowers. Returns the count."""
    import torch

    n = min(step_cpus() if n is None else max(1, n), torch.get_num_threads())
    torch.set_num_threads(n)
    if torch.get_num_interop_threads() > n:
        with contextlib.suppress(RuntimeError):  # settable only before the first inter-op work of the process
            torch.set_num_interop_threads(n)
    for var in _BLAS_ENV:
        os.environ.setdefault(var, str(n))
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - scikit-learn brings it
        return n
    for lib in ThreadpoolController().lib_controllers:  # numpy's OpenBLAS, torch's OpenMP, MKL
        if lib.num_threads > n:
            lib.set_num_threads(n)
    return n


@dataclass(frozen=True)
class LocalPlan:
    """How a local `alpha run` shares its host: the `cpu` and `cpu_training` pool limits and each step's CPUs."""

    cpu_pool_limit: int
    cpus_per_step: int


def local_plan(cores: int, max_parallel: int) -> LocalPlan:
    """Every step of a local run is a process on this host. The CPU pools (data and report steps; RL training)
    take as many steps as the host has cores, up to MAX_PARALLEL; during training the `gpu` pool's MAX_PARALLEL
    steps and the `cpu_training` pool's steps run at once, so each gets the cores over their sum (at least 1)."""
    pools = max(1, min(max_parallel, cores))
    return LocalPlan(pools, max(1, cores // (max_parallel + pools)))
