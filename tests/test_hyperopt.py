"""PSO hyperparameter search: finds a known minimum, is deterministic for a seed, and feeds train-supervised."""

from __future__ import annotations

import json
import math

import pytest
from helpers import SMALL_BARS, flags

from alpha_core.cli import main
from alpha_core.errors import PlanError
from alpha_core.hyperopt.pso import HyperoptConfig, hyperopt, pso_minimize
from alpha_core.models.registry import choice, integer, log

SPACE = {"lr": log(1e-4, 1e-1), "width": integer(1, 9), "act": choice("relu", "tanh", "gelu")}


def bowl(p: dict) -> float:
    """Minimum 0 at lr=1e-2, width=6, act=tanh."""
    return (math.log10(p["lr"]) + 2) ** 2 + (p["width"] - 6) ** 2 / 10 + (0 if p["act"] == "tanh" else 1)


def test_pso_finds_the_minimum_of_a_known_function():
    best, history = pso_minimize(bowl, SPACE, trials=150, workers=1, seed=1)
    assert len(history) == 150
    assert bowl(best) < 0.05, best
    assert best["act"] == "tanh" and best["width"] == 6 and abs(math.log10(best["lr"]) + 2) < 0.2


def test_pso_is_deterministic_for_a_seed_with_one_worker_and_runs_generations_concurrently():
    a = pso_minimize(bowl, SPACE, trials=20, workers=1, seed=7)[1]
    b = pso_minimize(bowl, SPACE, trials=20, workers=1, seed=7)[1]
    assert [h["params"] for h in a] == [h["params"] for h in b]
    parallel = pso_minimize(bowl, SPACE, trials=12, workers=4, seed=7)[1]
    assert len(parallel) == 12


def test_hyperopt_end_to_end_produces_a_params_file_train_supervised_accepts(tiny_data, tmp_path):
    bars = tiny_data / "ES.FUT" / "ohlcv-1m"
    results_path = tmp_path / "hyperopt" / "mamba2" / "ES.FUT" / "results.json"
    argv = [
        "hyperopt",
        *flags(
            model="mamba2", trials=3, data_dir=bars, output=results_path, predecoded_dir=tmp_path / "pd", seed=3, **SMALL_BARS
        ),
    ]
    assert main(argv) == 0
    results = json.loads(results_path.read_text())
    assert len(results["trials"]) == 3 and results["seed"] == 3
    assert set(results["best_params"]) == {"lr", "d_model", "d_state", "n_layers"}
    assert results["best_score"] == max(t["score"] for t in results["trials"])
    assert {"alpha", "nevergrad", "torch"} <= set(results["versions"])
    # the default plan (3 walk-forward folds, tested on 2024-Q3..2025-Q1): only the files before its first test file
    assert results["train_files"] == ["2024-Q1"] and results["val_files"] == ["2024-Q2"]  # calendar quarters
    assert results["plan_test_files"] == ["2024-Q3", "2024-Q4", "2025-Q1"]
    assert all(isinstance(t["val_sharpe"], float) and math.isfinite(t["val_sharpe"]) for t in results["trials"])
    train = [
        "train-supervised",
        *flags(
            model="mamba2",
            data_dir=bars,
            output_dir=tmp_path / "m",
            params_file=results_path,
            predecoded_dir=tmp_path / "pd",
            **SMALL_BARS,
        ),
    ]
    assert main(train) == 0
    params = json.loads((tmp_path / "m" / "fold-0" / "params.json").read_text())
    for key, value in results["best_params"].items():
        assert params[key] == value


def test_models_without_a_search_space_are_refused(tmp_path):
    with pytest.raises(PlanError, match="model 'kan' has no hyperopt search space"):
        hyperopt(HyperoptConfig(model="kan", data_dir=tmp_path, output=tmp_path / "r.json"))
