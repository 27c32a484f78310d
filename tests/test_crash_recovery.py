"""Kill -9 at every commit step of every writer (`ALPHA_FAULT`): a rerun or `--resume` then ends exactly like a
run that was never interrupted, and nothing a reader looks at is ever half written or mixed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SMALL_BOOK, flags
from safetensors.torch import load_file

from alpha_core.artifacts import verify
from alpha_core.cli import main
from alpha_core.train.perception import STATE_DIR, STATE_JSON

pytestmark = pytest.mark.slow  # Dagster runs, killed processes or a browser: `make check` leaves them out

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = {"wall_time_s", "sequences_per_s", "env_steps_per_s", "stage_s", "attempt", "unit", "created"}


def run_cli(argv: list[str], fault: str | None = None) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ALPHA_FAULT": fault or "", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "alpha_core.cli", *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    ).returncode


def stable(summary_path: Path) -> dict:
    """A summary without its wall-clock figures (an epoch's `epoch_s` too): what a resume must reproduce."""
    summary = {k: v for k, v in json.loads(summary_path.read_text()).items() if k not in VOLATILE}
    if "epoch_metrics" in summary:
        summary["epoch_metrics"] = [{k: v for k, v in row.items() if k != "epoch_s"} for row in summary["epoch_metrics"]]
    return summary


def weights(path: Path) -> dict:
    return {k: v.tolist() for k, v in load_file(str(path)).items()}


# --- the flagship: killed anywhere, `--resume` finishes with the same summary and weights ---------------------

PERCEPTION = flags(**SMALL_BOOK)
EARLY_STOP = flags(
    epochs=4,
    early_stop_metric="auc_h1000",
    early_stop_patience=1,
    lr_cfc="1e-12",
    lr_mamba2="1e-12",
    lr_aux="1e-12",
    n_val_seqs=100000,
)  # learning rates too small to move a float32 weight, and every validation window each epoch (not a sample of
# them): epoch 1 scores exactly as epoch 0, cannot improve on it, and the run stops after epoch 2 on any machine
PERCEPTION_KILLS = [
    "tmp.before_commit#1",
    "tmp.after_commit#3",
    "state.after_commit#2",
    "attempt.before_complete",
    "attempt.before_promote",
    "attempt.after_promote",
]


@pytest.fixture(scope="module")
def perception_reference(tiny_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("perception")
    argv = ["train", "--mbp10-data-dir", str(tiny_data / "ES.FUT" / "mbp-10"), "--predecoded-dir", str(tmp / "pd"), *PERCEPTION]
    assert run_cli([*argv, "--out", str(tmp / "straight"), "--early-stop-metric", "none"]) == 0
    assert run_cli([*argv, "--out", str(tmp / "stopped"), *EARLY_STOP]) == 0
    return argv, tmp


@pytest.mark.parametrize("fault", PERCEPTION_KILLS)
def test_perception_resumes_to_the_uninterrupted_result(perception_reference, tmp_path, fault):
    argv, ref = perception_reference
    out = tmp_path / "killed"
    args = [*argv, "--out", str(out), "--early-stop-metric", "none"]
    assert run_cli(args, fault) == -9, f"the run was not killed at {fault}"
    fold = out / "fold-0"
    if fold.exists():  # promoted before the kill: what it shows is whole
        assert verify(fold) == []
    assert run_cli([*args, "--resume"]) == 0
    straight = ref / "straight" / "fold-0"
    assert stable(fold / "alpha_train_summary.json") == stable(straight / "alpha_train_summary.json")
    for name in ("trunk_best_h1000.safetensors", "model_best_mean_auc.safetensors", "model_best_val_loss.safetensors"):
        assert weights(fold / name) == weights(straight / name), name
    assert verify(fold, deep=True) == []


def test_a_resume_after_an_early_stop_only_finishes_the_summary(perception_reference, tmp_path):
    argv, ref = perception_reference
    reference = json.loads((ref / "stopped" / "fold-0" / "alpha_train_summary.json").read_text())
    assert reference["early_stopped"] and reference["epochs"] < 4
    out = tmp_path / "killed"
    args = [*argv, "--out", str(out), *EARLY_STOP]
    # the state of the stopping epoch is committed, the summary is not
    assert run_cli(args, f"state.after_commit#{reference['epochs']}") == -9
    assert run_cli([*args, "--resume"]) == 0
    stopped = ref / "stopped" / "fold-0"
    assert stable(out / "fold-0" / "alpha_train_summary.json") == stable(stopped / "alpha_train_summary.json")
    assert weights(out / "fold-0" / "trunk_best_h1000.safetensors") == weights(stopped / "trunk_best_h1000.safetensors")


def test_resume_refuses_a_state_of_another_config(perception_reference, tmp_path, capsys):
    argv, _ = perception_reference
    out = tmp_path / "killed"
    assert run_cli([*argv, "--out", str(out)], "state.after_commit#1") == -9
    assert main([*argv, "--out", str(out), "--seq-len", "16", "--resume"]) == 2
    assert "seq_len=8" in capsys.readouterr().err


def gpu_pod_state(out: Path) -> None:
    """Make a killed CPU run's committed state read as a GPU pod's: the fast path it ran is recorded in it."""
    (state,) = out.glob(f".fold-0.attempts/*/{STATE_DIR}/{STATE_JSON}")
    saved = json.loads(state.read_text())
    saved["config"] |= {"device": "cuda", "cuda_graph": True, "compile": True}
    state.write_text(json.dumps(saved))


def test_a_state_saved_on_a_gpu_resumes_on_the_cpu(perception_reference, tmp_path, capsys):
    """A pre-empted GPU pod's fold resumes on the CPU, which neither captures nor compiles the step: both steps
    train the same batches when the epoch is whole batches, so it ends as the uninterrupted run; with a partial
    batch the two steps' epochs differ, and the resume is refused with both counts."""
    argv, ref = perception_reference
    out = tmp_path / "killed"
    args = [*argv, "--out", str(out), "--early-stop-metric", "none"]
    assert run_cli(args, "state.after_commit#1") == -9
    gpu_pod_state(out)
    assert run_cli([*args, "--resume"]) == 0
    straight = ref / "straight" / "fold-0" / "alpha_train_summary.json"
    assert stable(out / "fold-0" / "alpha_train_summary.json") == stable(straight)

    partial = [*argv, "--out", str(tmp_path / "partial"), "--n-train-seqs", "100"]  # batches of 32
    assert run_cli(partial, "state.after_commit#1") == -9
    gpu_pod_state(tmp_path / "partial")
    capsys.readouterr()
    assert main([*partial, "--resume"]) == 2
    assert "captured step trains 3 whole batches an epoch, the eager one 4" in capsys.readouterr().err


def test_resume_checks_a_complete_attempt_and_promotes_it(perception_reference, tmp_path, capsys):
    """Train 2 epochs (promoted); start 3 epochs with another seed and kill it just before promotion. A resume with
    the killed run's settings promotes its complete attempt; one with other settings is refused like an
    unfinished one, and the output keeps showing what it showed."""
    argv, _ = perception_reference
    out = tmp_path / "out"
    two = [a if a != "3" else "2" for a in argv]  # --epochs 2
    assert main([*two, "--out", str(out)]) == 0
    assert json.loads((out / "fold-0" / "alpha_train_summary.json").read_text())["epochs"] == 2
    assert run_cli([*argv, "--out", str(out), "--seed", "7"], "attempt.before_promote") == -9
    assert json.loads((out / "fold-0" / "alpha_train_summary.json").read_text())["epochs"] == 2
    capsys.readouterr()
    assert main([*argv, "--out", str(out), "--seed", "8", "--resume"]) == 2
    assert "seed=7" in capsys.readouterr().err
    assert json.loads((out / "fold-0" / "alpha_train_summary.json").read_text())["epochs"] == 2
    assert main([*argv, "--out", str(out), "--seed", "7", "--resume"]) == 0
    summary = json.loads((out / "fold-0" / "alpha_train_summary.json").read_text())
    assert summary["epochs"] == 3 and verify(out / "fold-0", deep=True) == []


# --- walk-forward members: a killed run or rerun never changes or mixes what `fold-<k>` shows ---------------

SUPERVISED_KILLS = ["tmp.before_commit#4", "attempt.before_complete", "attempt.after_promote"]


@pytest.fixture(scope="module")
def supervised_reference(tiny_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("supervised")
    argv = [
        "train-supervised",
        *flags(
            model="tft",
            data_dir=tiny_data / "ES.FUT",
            predecoded_dir=tmp / "pd",
            epochs=2,
            cv_n_folds=2,
            cv_train_window=2,
            cv_fold=0,
            seq_len=16,
            batch_size=32,
            n_train_seqs=128,
            n_val_seqs=128,
            device="cpu",
            param="d_model=16",
        ),
    ]
    assert run_cli([*argv, "--output-dir", str(tmp / "straight")]) == 0
    return argv, tmp / "straight" / "fold-0"


def test_a_multi_fold_run_is_one_unit(tiny_data, tmp_path):
    """Every fold of a run, promoted together: a rerun killed after its first fold completed changes nothing the
    output shows; one killed while promoting leaves a mix that `alpha evaluate` never puts into one row."""
    from alpha_core.eval.evaluate import find_checkpoints

    argv = [
        "train-supervised",
        *flags(
            model="kan",
            data_dir=tiny_data / "ES.FUT",
            predecoded_dir=tmp_path / "pd",
            epochs=1,
            seq_len=16,
            batch_size=64,
            n_train_seqs=128,
            n_val_seqs=64,
            device="cpu",
            output_dir=tmp_path / "models" / "kan" / "ES.FUT",
        ),
    ]
    folds = [tmp_path / "models" / "kan" / "ES.FUT" / f"fold-{k}" for k in range(3)]
    assert run_cli(argv) == 0
    first = [json.loads((f / "summary.json").read_text())["unit"] for f in folds]
    assert len(set(first)) == 1 and first[0] is not None
    rerun = [*argv, "--seed", "7"]  # other settings: another unit (the same settings would be the same unit)
    assert run_cli(rerun, "attempt.before_complete#2") == -9  # fold 0 of the rerun complete, fold 1 not
    assert [json.loads((f / "summary.json").read_text())["unit"] for f in folds] == first
    assert run_cli(rerun, "attempt.after_promote#1") == -9  # the rerun's fold 0 promoted, folds 1-2 not yet
    units = [json.loads((f / "summary.json").read_text())["unit"] for f in folds]
    assert units[0] != first[0] and units[1:] == first[1:]
    kept, excluded = find_checkpoints(tmp_path / "models", ["ES.FUT"])
    assert [(c.fold, c.summary["unit"]) for c in kept] == [(0, units[0])]
    assert {e.fold for e in excluded} == {1, 2} and all("a row never mixes settings" in e.reason for e in excluded)


@pytest.mark.parametrize("fault", SUPERVISED_KILLS)
def test_a_killed_rerun_keeps_the_completed_fold_and_a_rerun_matches(supervised_reference, tmp_path, fault):
    argv, reference = supervised_reference
    out = tmp_path / "models"
    shutil.copytree(reference.parent, out, symlinks=True)  # a completed output dir, as the first run left it
    first = stable(out / "fold-0" / "summary.json")
    assert run_cli([*argv, "--output-dir", str(out)], fault) == -9, f"the run was not killed at {fault}"
    assert verify(out / "fold-0", deep=True) == []  # the completed fold is untouched, or wholly the new one
    assert stable(out / "fold-0" / "summary.json") == first
    assert run_cli([*argv, "--output-dir", str(out)]) == 0
    assert stable(out / "fold-0" / "summary.json") == stable(reference / "summary.json")
    assert weights(out / "fold-0" / "model.safetensors") == weights(reference / "model.safetensors")


# --- sidecars: a killed build leaves no sidecar and the rebuild is identical ---------------------------------


@pytest.mark.parametrize("fault", ["tmp.after_commit#1"])
def test_a_killed_predecode_rebuilds_the_same_sidecar(tiny_data, tmp_path, fault):
    argv = ["predecode", "--data-dir", str(tiny_data), "--symbols", "ES.FUT"]
    assert run_cli([*argv, "--predecoded-dir", str(tmp_path / "straight")]) == 0
    assert run_cli([*argv, "--predecoded-dir", str(tmp_path / "killed")], fault) == -9
    assert run_cli([*argv, "--predecoded-dir", str(tmp_path / "killed")]) == 0

    def arrays(root: Path) -> dict:
        return {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*.npy"))
            if not p.parent.name.startswith(".")
        }

    assert arrays(tmp_path / "killed") == arrays(tmp_path / "straight")


# --- the report: its JSON is the commit point of the whole set -----------------------------------------------


@pytest.mark.parametrize("fault", ["report.before_json"])
def test_a_killed_report_leaves_no_report_and_a_rerun_is_whole(supervised_reference, tiny_data, tmp_path, fault):
    from alpha_core.eval.report import load_report

    _, fold0 = supervised_reference
    models = tmp_path / "models" / "tft"
    models.mkdir(parents=True)
    (models / "ES.FUT").symlink_to(fold0.parent, target_is_directory=True)
    argv = [
        "evaluate",
        *flags(
            models_dir=tmp_path / "models",
            data_dir=tiny_data,
            predecoded_dir=tmp_path / "pd",
            device="cpu",
            min_val_auc=0,
            min_val_sharpe=-1000,
        ),
    ]  # a tiny model near chance is still reported
    out = tmp_path / "eval" / "ensemble_report.json"
    assert run_cli([*argv, "--output", str(tmp_path / "straight.json")]) == 0
    assert run_cli([*argv, "--output", str(out)]) == 0
    assert run_cli([*argv, "--output", str(out)], fault) == -9
    assert not out.exists(), "a report whose set was being replaced must not be readable"
    assert run_cli([*argv, "--output", str(out)]) == 0
    report, straight = load_report(out), load_report(tmp_path / "straight.json")
    assert report.symbols == straight.symbols and report.excluded == straight.excluded
