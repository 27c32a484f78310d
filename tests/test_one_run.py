"""What a researcher meets after the demo, at the command line: every trainer says whether its folds passed the
pipeline's gate, folds trained one call at a time build the same unit as one call for all, the report counts test
folds by their own numbers, and any alpha command stops on SIGTERM like Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import polars as pl
import pytest

pytestmark = pytest.mark.slow  # each test trains

ALPHA = [sys.executable, "-m", "alpha_core.cli"]
TINY_KAN = [
    "train-supervised",
    "--model",
    "kan",
    "--epochs",
    "1",
    "--n-train-seqs",
    "128",
    "--n-val-seqs",
    "64",
    "--seq-len",
    "16",
    "--batch-size",
    "64",
    "--device",
    "cpu",
]


def alpha(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([*ALPHA, *args], capture_output=True, text=True, env=env, timeout=600)


def test_per_fold_calls_accumulate_into_one_unit_and_every_trainer_prints_its_gate(tiny_data, tmp_path):
    data, cache, out = tiny_data / "ES.FUT", tmp_path / "pd", tmp_path / "models" / "kan" / "ES.FUT"
    common = [*TINY_KAN, "--data-dir", str(data), "--predecoded-dir", str(cache), "--output-dir", str(out)]
    for fold in range(3):  # how pods train: one fold per call, into one output folder
        done = alpha(*common, "--cv-fold", str(fold))
        assert done.returncode == 0, done.stderr
        (line,) = [x for x in done.stdout.splitlines() if x.startswith(f"fold {fold} gate: ")]
        assert "mean validation AUC" in line and ("passed" in line or "FAILED" in line), line
    units = {json.loads((out / f"fold-{k}" / "summary.json").read_text())["unit"] for k in range(3)}
    assert len(units) == 1, "the same settings, one call per fold: one unit"

    report = tmp_path / "eval" / "report.json"
    done = alpha(
        "evaluate", "--models-dir", str(tmp_path / "models"), "--data-dir", str(tiny_data), "--output", str(report),
        "--predecoded-dir", str(cache), "--min-val-auc", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    body = json.loads(report.read_text())
    rows = body["symbols"]["ES.FUT"]
    assert [f["fold"] for f in rows["models"]["kan"]["folds"]] == [0, 1, 2]
    assert not [e for e in body["excluded"] if e["model"] == "kan"], body["excluded"]
    for ensemble in rows["ensembles"].values():  # the folds' own numbers, not 0..n-1 of the files the row has
        assert [f["fold"] for f in ensemble["folds"]] == [0, 1, 2]
    assert "ES.FUT: out of sample over 3 test fold(s)" in done.stdout

    # one fold again, evaluated alone: its own number, and one test fold in the headline
    alone = tmp_path / "alone" / "kan" / "ES.FUT"
    (alone.parent).mkdir(parents=True)
    os.symlink(out / "fold-1", alone.parent / "fold-1-link")
    (alone).mkdir()
    os.rename(alone.parent / "fold-1-link", alone / "fold-1")
    done = alpha(
        "evaluate", "--models-dir", str(tmp_path / "alone"), "--data-dir", str(tiny_data),
        "--output", str(tmp_path / "eval1" / "report.json"), "--predecoded-dir", str(cache), "--min-val-auc", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "out of sample over 1 test fold(s)" in done.stdout

    # the rows and equity as tables, and two reports compared side by side with what differs between them
    rows = pl.read_parquet(tmp_path / "eval" / "report_rows.parquet")
    assert rows.filter(pl.col("row") == "kan")["folds"].to_list() == ["0,1,2"]
    assert pl.read_csv(tmp_path / "eval" / "report_rows.csv").shape == rows.shape
    equity = pl.read_parquet(tmp_path / "eval" / "report_equity.parquet")
    assert set(equity["row"]) == {"kan", "equal_weight", "validation_weighted"} and equity["time"].dtype == pl.Datetime(
        "ns", "UTC"
    )
    done = alpha("compare", str(report), str(tmp_path / "eval1" / "report.json"))
    assert done.returncode == 0, done.stderr
    assert "ES.FUT: out-of-sample Sharpe (DSR) per run" in done.stdout
    (kan,) = [line for line in done.stdout.splitlines() if line.strip().startswith("kan ")]
    assert kan.count("(") == 2, kan  # a Sharpe (DSR) cell for each report
    assert "kan.data.fold 0.test" in done.stdout, "the folds one report has and the other lacks are named"

    # a model one report lacks is one line, not each of its settings against nothing
    lacking = tmp_path / "lacking"
    shutil.copytree(tmp_path / "eval1", lacking)
    body = json.loads((lacking / "report.json").read_text())
    del body["symbols"]["ES.FUT"]["models"]["kan"]
    (lacking / "report.json").write_text(json.dumps(body))
    done = alpha("compare", str(report), str(lacking / "report.json"))
    assert done.returncode == 0, done.stderr
    assert f"kan: checkpoints in {report} only" in done.stdout and "kan." not in done.stdout, done.stdout


def test_strict_gate_makes_a_miss_exit_1(tiny_data, tmp_path):
    args = [*TINY_KAN, "--data-dir", str(tiny_data / "ES.FUT"), "--predecoded-dir", str(tmp_path / "pd")]
    args += ["--output-dir", str(tmp_path / "m"), "--cv-fold", "0", "--min-val-auc", "0.99"]
    lenient = alpha(*args)
    assert lenient.returncode == 0, "the gate is the pipeline's decision: reported, exit 0"
    assert "fold 0 gate: FAILED: mean validation AUC" in lenient.stdout and "<= 0.99" in lenient.stdout
    strict = alpha(*args, "--strict-gate")
    assert strict.returncode == 1 and "fold 0 gate: FAILED" in strict.stdout


def test_sigterm_stops_a_training_like_ctrl_c(tiny_data, tmp_path):
    args = [*TINY_KAN, "--epochs", "1000", "--data-dir", str(tiny_data / "ES.FUT"), "--predecoded-dir", str(tmp_path / "pd")]
    proc = subprocess.Popen(
        [*ALPHA, *args, "--output-dir", str(tmp_path / "m"), "--cv-fold", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert "epoch 0" in proc.stdout.readline()  # training is under way
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130 and err == "", err
    assert not (tmp_path / "m" / "fold-0").exists(), "nothing promoted"
