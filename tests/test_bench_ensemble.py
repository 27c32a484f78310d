"""The ensemble bench's arithmetic: the pod schedule's makespan, and the projection to the seed's numbers."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

_spec = importlib.util.spec_from_file_location("bench_ensemble", Path(__file__).parent.parent / "bench" / "bench_ensemble.py")
bench = sys.modules["bench_ensemble"] = importlib.util.module_from_spec(_spec)  # dataclasses look their module up
_spec.loader.exec_module(bench)


def test_schedule_respects_dependencies_and_each_pools_cap():
    durations = {"h": 10.0, "a0": 5.0, "a1": 5.0, "g": 10.0, "c": 15.0, "e": 3.0}
    deps = {"a0": ["h"], "a1": ["h"], "e": ["a0", "a1", "g", "c"]}
    pools = {"h": "gpu", "a0": "gpu", "a1": "gpu", "g": "gpu", "c": "cpu", "e": "cpu"}
    # unlimited pods: the longest chain h -> a -> e
    makespan, times = bench.schedule(durations, deps, pools, {"gpu": 10, "cpu": 10})
    assert makespan == 18.0 and times["e"] == (15.0, 18.0)
    # one GPU pod: the GPU jobs run one after another (30 s), the CPU job beside them, never in a GPU slot
    makespan, times = bench.schedule(durations, deps, pools, {"gpu": 1, "cpu": 1})
    assert makespan == 33.0 and times["c"] == (0.0, 15.0)
    assert times["h"][1] <= min(times["a0"][0], times["a1"][0])


def test_schedule_refuses_a_cycle():
    with pytest.raises((ValueError, RecursionError)):
        bench.schedule({"a": 1.0, "b": 1.0}, {"a": ["b"], "b": ["a"]}, {"a": "gpu", "b": "gpu"}, {"gpu": 1})


def test_projection_scales_the_epoch_loop_and_keeps_the_fixed_cost():
    assert bench.project(wall_s=100.0, work_s=80.0, factor=25.0) == 20.0 + 80.0 * 25
    assert bench.train_factor(50, 2, early_stopped=False) == 25.0
    assert bench.train_factor(50, 7, early_stopped=True) == 1.0  # it would have stopped there at 50 too


def test_folds_not_run_hyperopt_and_evaluation_are_projected_and_marked():
    specs = {
        "m": SimpleNamespace(trainer="supervised", search_space={"lr": None}),
        "r": SimpleNamespace(trainer="rl", search_space=None),
    }
    jobs = bench.plan_jobs(specs, {"m": "cuda", "r": "cpu", "evaluate": "cpu"}, 3, [0], None)
    assert [j.id for j in jobs if j.run] == ["hyperopt/m", "train/m/0", "train/r/0", "evaluate"]
    results = {
        "hyperopt/m": {"wall_s": 30.0, "work_s": 20.0, "trials_run": 2},
        "train/m/0": {"wall_s": 60.0, "work_s": 50.0, "epochs_run": 5, "early_stopped": False},
        "train/r/0": {"wall_s": 40.0, "work_s": 10.0, "epochs_run": 4, "early_stopped": True},
        "evaluate": {"wall_s": 12.0, "work_s": 10.0, "checkpoints": 2},
    }
    for job in jobs:
        job.result = {"rc": 0, **results[job.id]} if job.id in results else {}
    seed = {"epochs": 50, "trials": 20, "trial_epochs": {"supervised": 3, "rl": 10}}
    bench.fill_projections(jobs, seed, {"trial_epochs": {"supervised": 1, "rl": 10}})
    got = {j.id: j.result for j in jobs}
    assert got["hyperopt/m"]["projected_s"] == 10.0 + 20.0 * (20 / 2) * 3
    assert got["train/m/0"]["projected_s"] == 10.0 + 50.0 * 10 and got["train/m/0"]["projected"]
    assert got["train/r/0"]["projected_s"] == 40.0 and not got["train/r/0"]["projected"]  # stopped early: as measured
    assert got["train/m/2"]["projected_s"] == 510.0 and got["train/m/2"]["projected"]  # fold 0's figure
    assert got["evaluate"]["projected_s"] == 2.0 + 10.0 * 3  # 6 checkpoints planned, 2 evaluated
    tot = bench.totals(jobs, eur_gpu=3.0, eur_cpu=0.5, caps={"gpu": 10, "cpu": 10})
    gpu_s, cpu_s = 610.0 + 3 * 510.0, 3 * 40.0 + 32.0
    assert tot["gpu_hours"] == pytest.approx(gpu_s / 3600) and tot["cpu_hours"] == pytest.approx(cpu_s / 3600)
    assert tot["eur"] == pytest.approx(gpu_s / 3600 * 3.0 + cpu_s / 3600 * 0.5)
    assert tot["complete"] and tot["projected"]
    assert tot["schedule"]["makespan_s"] == 610.0 + 510.0 + 32.0  # hyperopt -> a fold of m -> evaluate
