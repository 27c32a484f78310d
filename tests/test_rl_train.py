"""`alpha train-rl` and RL hyperopt: walk-forward layout, validation Sharpe, params precedence and errors."""

from __future__ import annotations

import json

import pytest

from alpha_core.cli import main
from alpha_core.errors import PlanError
from alpha_core.train.rl import RLTrainConfig, train_rl


@pytest.fixture
def bars_dir(tiny_data):
    return tiny_data / "ES.FUT" / "ohlcv-1m"


def test_train_rl_writes_each_fold_with_the_best_policy(bars_dir, tmp_path, capsys):
    params = tmp_path / "results.json"
    params.write_text(json.dumps({"best_params": {"gamma": 0.5, "learning_rate": 0.002}}))
    argv = [
        "train-rl",
        "--model",
        "ppo",
        "--data-dir",
        str(bars_dir),
        "--output-dir",
        str(tmp_path / "ppo"),
        "--params-file",
        str(params),
        "--param",
        "learning_rate=0.0005",
        "--epochs",
        "2",
        "--timesteps-per-epoch",
        "1024",
        "--cv-n-folds",
        "2",
        "--cv-train-window",
        "2",
        "--n-envs",
        "4",
        "--predecoded-dir",
        str(tmp_path / "pd"),
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    for k in (0, 1):
        fold = tmp_path / "ppo" / f"fold-{k}"
        written = {p.name for p in fold.iterdir() if not p.name.startswith("events.out.tfevents")}  # + TensorBoard
        assert written == {
            "model.safetensors",
            "norm_stats.json",
            "agent_config.json",
            "env_config.json",
            "params.json",
            "summary.json",
            "manifest.json",
        }
        summary = json.loads((fold / "summary.json").read_text())
        assert summary["epochs"] == 2 and len(summary["val_sharpe_per_epoch"]) == 2
        assert summary["val_sharpe"] == max(summary["val_sharpe_per_epoch"])
        assert summary["params"]["gamma"] == 0.5 and summary["params"]["learning_rate"] == 0.0005
        assert summary["timesteps"] >= 2048
        assert set(summary["stage_s"]) >= {"data", "build", "epochs", "validation", "writing", "total"}  # issue 33
        # what makes an RL result checkable, every epoch (the CleanRL set): PPO's KL, clipping, value fit, entropy
        for row in summary["epoch_metrics"]:
            assert {"approx_kl", "clip_fraction", "explained_variance", "entropy", "train_loss"} <= set(row), row
            assert row["entropy"] > 0 and 0 <= row["clip_fraction"] <= 1
    assert "best validation Sharpe" in capsys.readouterr().out


def test_rl_params_file_errors_name_the_key(bars_dir, tmp_path):
    params = tmp_path / "bad.json"
    params.write_text(json.dumps({"lr": 0.01}))
    cfg = RLTrainConfig(model="dqn", data_dir=bars_dir, output_dir=tmp_path / "o", predecoded_dir=tmp_path / "pd")
    with pytest.raises(PlanError, match=r"bad.json: unknown parameter 'lr'"):
        train_rl(cfg, params)
    params.write_text(json.dumps({"gamma": "high"}))
    with pytest.raises(PlanError, match=r"bad.json: gamma: Input should be a valid number"):
        train_rl(cfg, params)


def test_rl_hyperopt_scores_trials_by_validation_sharpe(bars_dir, tmp_path):
    out = tmp_path / "results.json"
    argv = [
        "hyperopt",
        "--model",
        "dqn",
        "--trials",
        "2",
        "--epochs",
        "1",
        "--timesteps-per-epoch",
        "600",
        "--data-dir",
        str(bars_dir),
        "--output",
        str(out),
        "--predecoded-dir",
        str(tmp_path / "pd"),
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    results = json.loads(out.read_text())
    assert results["metric"].startswith("validation Sharpe") and len(results["trials"]) == 2
    assert set(results["best_params"]) == {"learning_rate", "gamma", "exploration_fraction"}
