"""Every trainer and the evaluation on CUDA, end to end (skipped without a GPU; run on the device machine).

Each supervised member, both RL agents and the flagship (with its GPU fast path: compile + CUDA graph + fused
scan) train one short fold on cuda as a promoted attempt, every searchable model runs one hyperopt trial on cuda,
and `alpha evaluate` backtests the checkpoints on cuda with the decision-clock check; the evaluation's
probabilities agree with a CPU evaluation of the same checkpoint.
On the device, `ALPHA_GPU_TEST_DATA` names a folder with `data/ES.FUT/...` and prebuilt sidecars in `pd/`
(`bench/prepare_gpu_carry.sh`), since the sidecar build stack is not installed there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import flags

from alpha_core.artifacts import verify
from alpha_core.cli import main
from alpha_core.data.dbn import MBP10
from alpha_core.data.loader import EpochCursor, WindowLoader
from alpha_core.data.norm import fit_norm_stats
from alpha_core.data.predecode import predecode
from alpha_core.models import registry

pytestmark = pytest.mark.cuda

SUPERVISED = [n for n, s in registry.REGISTRY.items() if s.trainer == "supervised"]
COMMON = flags(device="cuda", epochs=1, cv_n_folds=2, cv_fold=0)


@pytest.fixture(autouse=True)
def _tf32_stays_in_its_test():
    """Every command on CUDA turns TF32 matmuls on for its process (`resolve_device`); the model tests that run
    after these in one pytest process compare fp32 CUDA with the CPU at 1e-4 and must not inherit it."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    prebuilt = os.environ.get("ALPHA_GPU_TEST_DATA")
    if prebuilt:  # bench/prepare_gpu_carry.sh: ES.FUT's files in data/ES.FUT, their sidecars in pd
        (root / "pd").mkdir()
        (root / "pd" / "ES.FUT").symlink_to(Path(prebuilt, "pd").resolve(), target_is_directory=True)
        return Path(prebuilt) / "data", root / "pd"
    from alpha_core.data.demo import generate_demo_data

    generate_demo_data(root / "data", "tiny", seed=7, symbols=["ES.FUT"])
    return root / "data", root / "pd"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.mark.parametrize("model", SUPERVISED)
def test_supervised_member_trains_on_cuda(gpu_data, models_dir, model):
    data, pd = gpu_data
    out = models_dir / model / "ES.FUT"
    assert (
        main(
            [
                "train-supervised",
                *flags(
                    model=model,
                    data_dir=data / "ES.FUT",
                    predecoded_dir=pd / "ES.FUT",
                    output_dir=out,
                    seq_len=16,
                    batch_size=64,
                    n_train_seqs=256,
                    n_val_seqs=256,
                ),
                *COMMON,
            ]
        )
        == 0
    )
    summary = json.loads((out / "fold-0" / "summary.json").read_text())
    assert summary["device"].startswith("cuda") and np.isfinite(summary["final_train_loss"])
    assert verify(out / "fold-0", deep=True) == []


@pytest.mark.parametrize("model", ["dqn", "ppo"])
def test_rl_agent_trains_on_cuda(gpu_data, models_dir, model):
    data, pd = gpu_data
    out = models_dir / model / "ES.FUT"
    assert (
        main(
            [
                "train-rl",
                *flags(
                    model=model, data_dir=data / "ES.FUT", predecoded_dir=pd / "ES.FUT", output_dir=out, timesteps_per_epoch=512
                ),
                *COMMON,
            ]
        )
        == 0
    )
    summary = json.loads((out / "fold-0" / "summary.json").read_text())
    assert summary["device"].startswith("cuda") and np.isfinite(summary["val_sharpe"])


def test_the_fused_gather_equals_the_torch_gather_on_cuda(gpu_data):
    """The captured step's batch from one Triton kernel (`window_gather`) is bit for bit the torch gather's, at
    batch 1 and 64 and past the epoch's end (clamped). The CPU checks it in Triton's interpreter (test_loader)."""
    data, pd = gpu_data
    files = [p.sidecar for p in predecode(data / "ES.FUT" / "mbp-10", pd / "ES.FUT", None, MBP10)][:2]
    loader = WindowLoader(files, seq_len=64, n_max_sequences=200, seed=3, norm=fit_norm_stats(files), device="cuda")
    for batch in (1, 64):
        cursor = EpochCursor(loader, batch)
        cursor.cursor.fill_(loader.n_windows - batch // 2 - 1)
        fused = loader.batch_at_cursor(cursor.cursor, batch)
        expected = loader.batch_at(cursor.positions())
        for name, value in fused.__dict__.items():
            torch.testing.assert_close(value, getattr(expected, name), rtol=0, atol=0, equal_nan=True)


def flagship_flags(gpu_data, **overrides) -> list[str]:
    """`alpha train` on the test data's book, small sizes, fold 0 of 2 on cuda (each test overrides what it tests)."""
    data, pd = gpu_data
    sizes = dict(epochs=2, batch_size=64, n_train_seqs=1024, n_val_seqs=512, seq_len=16, cv_n_folds=2, cv_fold=0)
    return flags(mbp10_data_dir=data / "ES.FUT" / "mbp-10", predecoded_dir=pd / "ES.FUT", device="cuda", **(sizes | overrides))


def test_flagship_trains_on_the_gpu_fast_path_and_resumes(gpu_data, models_dir, tmp_path):
    out = models_dir / "perception" / "ES.FUT"  # `alpha train --out` holds fold-<k>, as every trainer writes
    argv = ["train", *flagship_flags(gpu_data)]
    assert main([*argv, "--out", str(out)]) == 0
    summary = json.loads((out / "fold-0" / "alpha_train_summary.json").read_text())
    assert summary["device"].startswith("cuda") and summary["epochs"] == 2 and summary["best_mean_auc"] > 0.5
    assert summary["cuda_graph"] and summary["compiled"], "on cuda the fast path is the default of every door"
    assert main([*argv, "--out", str(out), "--resume"]) == 0  # a finished run: nothing left to train
    assert json.loads((out / "fold-0" / "alpha_train_summary.json").read_text()) == summary


def test_the_fast_path_trains_what_the_eager_step_trains(gpu_data, tmp_path):
    """The default on cuda (compiled with Triton templates and combo kernels, one captured graph) and the plain
    eager step train the same model: the same losses epoch by epoch, within rounding."""
    argv = ["train", *flagship_flags(gpu_data, epochs=2, early_stop_metric="none")]
    assert main([*argv, "--out", str(tmp_path / "fast")]) == 0
    assert main([*argv, "--no-compile", "--no-cuda-graph", "--out", str(tmp_path / "eager")]) == 0
    fast, eager = (json.loads((tmp_path / d / "fold-0" / "alpha_train_summary.json").read_text()) for d in ("fast", "eager"))
    assert fast["compiled"] and fast["cuda_graph"] and not eager["compiled"] and not eager["cuda_graph"]
    for f, e in zip(fast["epoch_metrics"], eager["epoch_metrics"], strict=True):
        assert f["train_loss"] == pytest.approx(e["train_loss"], rel=1e-2)
        assert f["val_loss"] == pytest.approx(e["val_loss"], rel=1e-2)


def test_flagship_killed_mid_run_resumes_on_the_fast_path(gpu_data, tmp_path):
    """A pod pre-empted after its first epoch: `--resume` loads the optimiser state into the capturable AdamW,
    captures the step again and ends with the epochs an uninterrupted run has, learning as it does."""
    argv = ["train", *flagship_flags(gpu_data, epochs=3, early_stop_metric="none")]
    assert main([*argv, "--out", str(tmp_path / "straight")]) == 0
    path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "ALPHA_FAULT": "state.after_commit#1", "PYTHONPATH": path}  # the device's wheels stay found
    killed = subprocess.run([sys.executable, "-m", "alpha_core.cli", *argv, "--out", str(tmp_path / "killed")], env=env)
    assert killed.returncode == -signal.SIGKILL
    assert main([*argv, "--out", str(tmp_path / "killed"), "--resume"]) == 0
    straight, resumed = (
        json.loads((tmp_path / d / "fold-0" / "alpha_train_summary.json").read_text()) for d in ("straight", "killed")
    )
    assert resumed["cuda_graph"] and resumed["epochs"] == 3 and len(resumed["epoch_metrics"]) == 3
    assert resumed["epoch_metrics"][0]["train_loss"] == pytest.approx(straight["epoch_metrics"][0]["train_loss"], rel=1e-3)
    for later in (1, 2):  # the resumed epochs continue the optimiser, not a fresh one
        assert resumed["epoch_metrics"][later]["train_loss"] == pytest.approx(
            straight["epoch_metrics"][later]["train_loss"], rel=0.05
        )
    assert abs(resumed["best_mean_auc"] - straight["best_mean_auc"]) < 0.03
    assert verify(tmp_path / "killed" / "fold-0", deep=True) == []


def test_a_fold_killed_on_cuda_resumes_on_the_cpu(gpu_data, tmp_path):
    """A GPU pod pre-empted after its first epoch, finished where a GPU is not to be had: `--device cpu --resume`
    takes the captured step's state (the capturable AdamW's included) into the CPU's eager step."""
    argv = ["train", *flagship_flags(gpu_data, epochs=2, early_stop_metric="none")]
    path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "ALPHA_FAULT": "state.after_commit#1", "PYTHONPATH": path}
    killed = subprocess.run([sys.executable, "-m", "alpha_core.cli", *argv, "--out", str(tmp_path / "m")], env=env)
    assert killed.returncode == -signal.SIGKILL
    assert main([*argv, "--out", str(tmp_path / "m"), "--device", "cpu", "--resume"]) == 0
    summary = json.loads((tmp_path / "m" / "fold-0" / "alpha_train_summary.json").read_text())
    assert summary["device"] == "cpu" and summary["epochs"] == 2 and len(summary["epoch_metrics"]) == 2
    assert summary["best_mean_auc"] > 0.5
    assert verify(tmp_path / "m" / "fold-0", deep=True) == []


def test_a_batch_larger_than_the_fold_trains_eagerly_on_cuda(gpu_data, tmp_path, capsys):
    argv = flagship_flags(gpu_data, epochs=1, batch_size=2048, n_train_seqs=300, n_val_seqs=256)
    assert main(["train", *argv, "--out", str(tmp_path / "m")]) == 0
    assert "CUDA graph off: --batch-size 2048 exceeds fold 0's 300 training windows" in capsys.readouterr().out
    summary = json.loads((tmp_path / "m" / "fold-0" / "alpha_train_summary.json").read_text())
    assert not summary["cuda_graph"] and summary["n_train_seqs_consumed"] == 300
    assert main(["train", *argv, "--cuda-graph", "--out", str(tmp_path / "n")]) == 2


SEARCHABLE = [n for n, s in registry.REGISTRY.items() if s.search_space and s.trainer != "perception"]


@pytest.mark.parametrize("model", SEARCHABLE)
def test_one_hyperopt_trial_on_cuda(gpu_data, tmp_path, model):
    data, pd = gpu_data
    out = tmp_path / "results.json"
    assert (
        main(
            [
                "hyperopt",
                *flags(
                    model=model,
                    data_dir=data / "ES.FUT",
                    predecoded_dir=pd / "ES.FUT",
                    output=out,
                    trials=1,
                    epochs=1,
                    device="cuda",
                    cv_n_folds=2,
                    seq_len=16,
                    batch_size=64,
                    n_train_seqs=256,
                    n_val_seqs=256,
                    timesteps_per_epoch=512,
                ),
            ]
        )
        == 0
    )
    results = json.loads(out.read_text())
    assert results["settings"]["device"] == "cuda" and len(results["trials"]) == 1
    assert np.isfinite(results["best_score"]), results["trials"]


def test_evaluation_on_cuda_matches_cpu(gpu_data, models_dir, tmp_path):
    """Runs after the training tests above (file order): every checkpoint they wrote is backtested on cuda."""
    from alpha_core.eval.report import load_report

    data, pd = gpu_data
    reports = {}
    for device in ("cuda", "cpu"):
        out = tmp_path / device / "ensemble_report.json"
        assert (
            main(
                [
                    "evaluate",
                    *flags(
                        models_dir=models_dir,
                        data_dir=data,
                        predecoded_dir=pd,
                        output=out,
                        device=device,
                        min_val_auc=0,
                        min_val_sharpe=-1000,
                    ),
                ]
            )
            == 0
        )  # every one-epoch model is reported
        reports[device] = load_report(out)
    cuda, cpu = (reports[d].symbols["ES.FUT"] for d in ("cuda", "cpu"))
    assert set(cuda.models) == {*SUPERVISED, "dqn", "ppo", "perception"}, reports["cuda"].excluded
    for name, result in cuda.models.items():
        # probabilities: equal up to TF32/kernel differences; Diffusion samples from each device's own RNG stream
        if result.auc is not None and name != "diffusion":
            assert np.allclose(result.auc.model, cpu.models[name].auc.model, atol=0.02), name
    again = tmp_path / "again" / "ensemble_report.json"  # the same checkpoints on the same device: the same report
    assert (
        main(
            [
                "evaluate",
                *flags(
                    models_dir=models_dir,
                    data_dir=data,
                    predecoded_dir=pd,
                    output=again,
                    device="cuda",
                    min_val_auc=0,
                    min_val_sharpe=-1000,
                ),
            ]
        )
        == 0
    )
    assert load_report(again).symbols == reports["cuda"].symbols
