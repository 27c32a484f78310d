"""Threads per step: the CPUs a process was given (cgroup quota, affinity mask, a local run's share of the host)
decide its torch and BLAS threads, and the training entry points apply it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from alpha_core import cpus
from alpha_core.errors import PlanError

pytestmark = pytest.mark.slow  # Dagster runs, killed processes or a browser: `make check` leaves them out

ROOT = Path(__file__).resolve().parents[1]


def _cgroup_tree(tmp_path: Path, mounts: list[str], cgroup: list[str], files: dict[str, str]) -> tuple[Path, Path]:
    """A /proc/self/cgroup, a /proc/self/mountinfo and the cgroup files they point at, all under tmp_path."""
    for rel, text in files.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    (tmp_path / "cgroup").write_text("\n".join(cgroup) + "\n")
    (tmp_path / "mountinfo").write_text("\n".join(m.replace("TMP", str(tmp_path)) for m in mounts) + "\n")
    return tmp_path / "cgroup", tmp_path / "mountinfo"


def test_cgroup_v2_quota_is_the_tightest_along_the_path(tmp_path):
    """A pod's container (no limit of its own) under a pod cgroup of 1.5 CPUs under a node slice of 4."""
    cg, mi = _cgroup_tree(
        tmp_path,
        [
            "30 23 0:26 / TMP/fs rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate",
            "31 23 0:27 / TMP/other rw - tmpfs tmpfs rw",
        ],
        ["0::/kubepods/pod1/ctr"],
        {
            "fs/kubepods/cpu.max": "400000 100000\n",
            "fs/kubepods/pod1/cpu.max": "150000 100000\n",
            "fs/kubepods/pod1/ctr/cpu.max": "max 100000\n",
        },
    )
    limit = cpus.cgroup_cpu_limit(cg, mi)
    assert limit == 1.5
    assert cpus.decide(limit, affinity=8, share=None) == 1  # rounded down: a second thread would be throttled


def test_cgroup_v1_quota_beside_a_unified_hierarchy(tmp_path):
    """A hybrid host (this VM's layout): the v1 `cpu,cpuacct` controller sets 2.5 CPUs, the v2 mount has no cpu."""
    cg, mi = _cgroup_tree(
        tmp_path,
        [
            "40 25 0:35 / TMP/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct",
            "41 25 0:36 / TMP/memory rw - cgroup cgroup rw,memory",
            "42 25 0:37 / TMP/unified rw - cgroup2 cgroup2 rw",
        ],
        ["4:memory:/job", "2:cpu,cpuacct:/job", "0::/job"],
        {
            "cpu,cpuacct/job/cpu.cfs_quota_us": "250000\n",
            "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            "memory/job/cpu.cfs_quota_us": "100000\n",
        },
    )  # not the cpu controller: ignored
    assert cpus.cgroup_cpu_limit(cg, mi) == 2.5
    assert cpus.decide(2.5, affinity=16, share=None) == 2


def test_no_quota_and_unreadable_cgroups_leave_the_affinity(tmp_path):
    cg, mi = _cgroup_tree(tmp_path, ["30 23 0:26 / TMP/fs rw - cgroup2 cgroup2 rw"], ["0::/"], {"fs/cpu.max": "max 100000\n"})
    assert cpus.cgroup_cpu_limit(cg, mi) is None
    assert cpus.cgroup_cpu_limit(tmp_path / "missing", mi) is None
    assert cpus.decide(None, affinity=3, share=None) == 3


def test_host_share_and_the_least_of_all_three():
    assert cpus.host_share({}) is None
    assert cpus.host_share({cpus.ENV: "3"}) == 3
    for bad in ("0", "-2", "two"):
        with pytest.raises(PlanError, match=f"{cpus.ENV} must be a positive integer"):
            cpus.host_share({cpus.ENV: bad})
    assert cpus.decide(6.0, affinity=8, share=4) == 4
    assert cpus.decide(0.5, affinity=8, share=None) == 1  # never 0


def test_the_affinity_mask_is_read_live():
    """`taskset`/cpusets: a child restricted to one CPU counts one, and so decides one thread."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import os
        from alpha_core import cpus
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        print(cpus.affinity_cpus(), cpus.step_cpus())
    """),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, cpus.ENV: ""},
    )
    assert out.stdout.split() == ["1", "1"]


def test_local_run_shares_the_host():
    """The CPU pools take up to MAX_PARALLEL steps, never more than the cores; each step gets the cores over the
    steps that train at once (the `gpu` pool's MAX_PARALLEL plus the `cpu_training` pool's)."""
    assert cpus.local_plan(cores=2, max_parallel=10) == cpus.LocalPlan(cpu_pool_limit=2, cpus_per_step=1)
    assert cpus.local_plan(cores=64, max_parallel=10) == cpus.LocalPlan(cpu_pool_limit=10, cpus_per_step=3)
    assert cpus.local_plan(cores=16, max_parallel=2) == cpus.LocalPlan(cpu_pool_limit=2, cpus_per_step=4)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to see torch's threads lowered")
@pytest.mark.parametrize("given", ["affinity", "share"])
def test_training_entry_point_applies_the_decision(tiny_data, tmp_path, given):
    """`alpha train-supervised` in a child that starts with torch at its default (one thread per core) and is then
    given one CPU (an affinity mask, or a local run's ALPHA_CPUS_PER_STEP=1): inside the fold's training, torch,
    its inter-op pool and numpy's BLAS run one thread."""
    child = textwrap.dedent(f"""
        import json, os, sys
        import torch
        from threadpoolctl import threadpool_info
        from alpha_core.cli import main
        from alpha_core.train import supervised
        before = torch.get_num_threads()
        if {given!r} == "affinity":
            os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})
        seen = {{}}
        fold = supervised._train_fold
        def spy(*args, **kwargs):
            seen.update(intra=torch.get_num_threads(), interop=torch.get_num_interop_threads(),
                        blas=max(i["num_threads"] for i in threadpool_info()))
            return fold(*args, **kwargs)
        supervised._train_fold = spy
        rc = main(["train-supervised", "--model", "kan", "--epochs", "1", "--data-dir", sys.argv[1],
                   "--output-dir", sys.argv[2], "--cv-fold", "0", "--n-train-seqs", "64", "--n-val-seqs", "64",
                   "--batch-size", "32", "--device", "cpu", "--quiet"])
        print(json.dumps({{"rc": rc, "before": before, **seen}}))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    env[cpus.ENV] = "1" if given == "share" else ""
    out = subprocess.run(
        [sys.executable, "-c", child, str(tiny_data / "ES.FUT"), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["rc"] == 0 and seen["before"] >= 2, seen
    assert seen["intra"] == 1 and seen["interop"] == 1 and seen["blas"] == 1, seen
