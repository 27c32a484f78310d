"""The `alpha` console script: inspect, predecode, folds, demo-data (run as a real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ALPHA = [sys.executable, "-m", "alpha_core.cli"]


def alpha(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([*ALPHA, *args], capture_output=True, text=True, timeout=300, env=env)


def test_console_script_is_installed():
    exe = Path(sys.executable).with_name("alpha")
    assert exe.exists(), "pip install -e . should install the `alpha` console script"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for command in ("inspect", "predecode", "folds", "demo-data"):
        assert command in out.stdout


def test_inspect_json_reports_metadata_and_counts(samples):
    path = samples / "nautilus_trader/futures_ohlcv-1m_2024-07-01T23-40_2024-07-02T00-10.dbn.zst"
    out = alpha("inspect", str(path), "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert row["schema"] == "ohlcv-1m" and row["dataset"] == "GLBX.MDP3" and row["dbn_version"] == 1
    assert row["symbols"] == ["ESU4", "NQU4"] and row["records"] == 60
    assert row["first_ts"] == "2024-07-01T23:40:00+00:00" and row["last_ts"] == "2024-07-02T00:09:00+00:00"


def test_inspect_fails_on_a_file_that_is_not_dbn(tmp_path, samples):
    junk = tmp_path / "junk.dbn.zst"
    junk.write_bytes(b"\x28\xb5\x2f\xfd" + b"not really zstd" * 10)
    good = samples / "databento-python/GLBX.MDP3/test_data.mbp-10.dbn.zst"
    out = alpha("inspect", str(good), str(junk))
    assert out.returncode == 1
    assert "junk.dbn.zst" in out.stderr and "Traceback" not in out.stderr
    assert "schema=mbp-10" in out.stdout and "records=4" in out.stdout


def test_demo_data_predecode_then_reuse_then_folds(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "pd"
    out = alpha("demo-data", "--scale", "tiny", "--out", str(data), "--symbols", "ZN.FUT", "--quarters", "4")
    assert out.returncode == 0, out.stderr
    assert len(list((data / "ZN.FUT").rglob("*.dbn.zst"))) == 8

    first = alpha("predecode", "--data-dir", str(data), "--predecoded-dir", str(cache))
    assert first.returncode == 0, first.stderr
    lines = first.stdout.strip().splitlines()
    assert len(lines) == 8 and all(line.startswith("built") for line in lines)
    assert all("ZN.FUT" in line for line in lines)

    again = alpha("predecode", "--data-dir", str(data), "--predecoded-dir", str(cache), "--symbols", "ZN.FUT")
    assert again.returncode == 0 and all(line.startswith("reused") for line in again.stdout.splitlines())

    folds = alpha("folds", "--data-dir", str(data / "ZN.FUT"), "--cv-n-folds", "2", "--cv-train-window", "2",
                  "--json")
    assert folds.returncode == 0, folds.stderr
    plans = json.loads(folds.stdout)
    assert set(plans) == {"mbp-10", "ohlcv-1m"}
    fold0 = plans["mbp-10"]["folds"][0]
    assert [f["name"] for f in fold0["train"]] == ["ZN.FUT_2024-Q1.dbn.zst", "ZN.FUT_2024-Q2.dbn.zst"]
    assert [f["name"] for f in fold0["val"]] == ["ZN.FUT_2024-Q3.dbn.zst"]
    assert [f["name"] for f in fold0["test"]] == ["ZN.FUT_2024-Q4.dbn.zst"]

    too_many = alpha("folds", "--data-dir", str(data / "ZN.FUT"), "--cv-n-folds", "3", "--cv-train-window", "2")
    assert too_many.returncode == 2
    assert "CV layout overflows: cv_fold=2 + window=2 + 1 val file > 4 files available" in too_many.stderr
