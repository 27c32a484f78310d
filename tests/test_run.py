"""`alpha run` (the CI trigger) locally: the whole lineage for one symbol under one RUN_ID, in the spec's layout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMALL = {"seq_len": 16, "batch_size": 64, "n_train_seqs": 512, "n_val_seqs": 256, "device": "cpu", "min_val_auc": 0.0}


def test_alpha_run_full_pipeline_locally(tiny_data, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    storage = tmp_path / "storage"
    env = {**os.environ, "DAGSTER_HOME": str(home), "ALPHA_DATA_DIR": str(tiny_data), "ALPHA_STORAGE_ROOT": str(storage),
           "SYMBOLS": "ES.FUT", "MODELS": "mamba2,kan", "PHASE": "full", "EPOCHS": "1", "HYPEROPT_TRIALS": "2",
           "RUN_ID": "20261130-000000"}
    hyperopt = {"epochs": 1, "seq_len": 16, "batch_size": 64, "n_train_seqs": 256, "n_val_seqs": 128, "device": "cpu"}
    out = subprocess.run([sys.executable, "-m", "alpha_core.cli", "run", "--train-config", json.dumps(SMALL),
                          "--hyperopt-config", json.dumps(hyperopt)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "RUN_ID 20261130-000000: 6 steps (full)" in out.stdout
    run = storage / "20261130-000000"
    results = json.loads((run / "hyperopt" / "mamba2" / "ES.FUT" / "results.json").read_text())
    assert len(results["trials"]) == 2
    for model in ("mamba2", "kan"):
        assert sorted(p.name for p in (run / "models" / model / "ES.FUT").iterdir()) == ["fold-0", "fold-1", "fold-2"]
    params = json.loads((run / "models" / "mamba2" / "ES.FUT" / "fold-0" / "params.json").read_text())
    assert all(params[k] == v for k, v in results["best_params"].items()), "training used the hyperopt params"
    report = json.loads((run / "eval" / "ES.FUT" / "ensemble_report.json").read_text())
    assert set(report["symbols"]["ES.FUT"]["models"]) == {"mamba2", "kan"}
    assert (run / "folds" / "ES.FUT" / "fold_plans.json").exists()
