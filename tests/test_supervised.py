"""The registry, params precedence (defaults < params file < CLI) and `alpha train-supervised` end to end."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import flags
from model_harness import assert_causal
from safetensors.torch import load_file, load_model, save_model

from alpha_core import stages as stages_module
from alpha_core.artifacts import verify
from alpha_core.cli import main
from alpha_core.errors import PlanError
from alpha_core.models import registry
from alpha_core.train.supervised import SupervisedTrainConfig, train_supervised

SUPERVISED_BARS = [n for n, s in registry.REGISTRY.items() if s.trainer == "supervised"]
FAST = dict(epochs=1, seq_len=16, batch_size=32, n_train_seqs=128, n_val_seqs=128, cv_n_folds=2, cv_train_window=2)


@pytest.mark.parametrize("name", SUPERVISED_BARS)
def test_every_supervised_model_builds_runs_and_round_trips(name, tmp_path):
    spec = registry.get(name)
    model = spec.build(n_features=13)
    x = torch.randn(2, 12, 13)
    torch.manual_seed(0)
    out = model(x)
    assert out.shape == (2, 12, 3) and torch.isfinite(out).all()
    assert_causal(model, 13, seq_len=12)
    save_model(model, str(tmp_path / "m.safetensors"))
    again = spec.build(n_features=13)
    load_model(again, str(tmp_path / "m.safetensors"))
    torch.manual_seed(0)
    reloaded = again(x)
    torch.manual_seed(0)
    torch.testing.assert_close(reloaded, model(x), rtol=0, atol=0)


def test_select_follows_the_spec_models_variable():
    assert registry.select("all") == list(registry.REGISTRY)
    assert "perception" in registry.select("supervised") and "tft" in registry.select("supervised")
    assert registry.select("tft,kan") == ["tft", "kan"]
    with pytest.raises(PlanError, match=r"unknown model 'gpt'; registered: perception, tft"):
        registry.select("tft,gpt")


@pytest.fixture
def bars_dir(tiny_data):
    return tiny_data / "ES.FUT" / "ohlcv-1m"


def run(bars_dir, tmp_path, params_file=None, explicit=None, **overrides):
    cfg = SupervisedTrainConfig(
        model="tft",
        data_dir=bars_dir,
        output_dir=tmp_path / "out",
        predecoded_dir=tmp_path / "pd",
        device="cpu",
        **{**FAST, **overrides},
    )
    return train_supervised(cfg, params_file, explicit)


def test_params_precedence_defaults_then_file_then_cli(bars_dir, tmp_path):
    params = tmp_path / "results.json"
    params.write_text(json.dumps({"best_params": {"d_model": 16, "n_heads": 2, "lr": 0.002}}))
    (summary,) = run(bars_dir, tmp_path, params, {"lr": 0.005, "n_heads": 4}, cv_fold=0)
    resolved = json.loads((tmp_path / "out" / "fold-0" / "params.json").read_text())
    assert resolved["d_model"] == 16  # params file over the compiled default (32)
    assert resolved["n_heads"] == 4 and resolved["lr"] == 0.005  # the command line over the params file
    assert resolved["lstm_layers"] == 1  # compiled default
    assert summary.params == resolved
    config = json.loads((tmp_path / "out" / "fold-0" / "model_config.json").read_text())
    assert config["d_model"] == 16 and config["n_features"] == 13


def test_missing_params_file_means_defaults(bars_dir, tmp_path):
    (summary,) = run(bars_dir, tmp_path, tmp_path / "no-such-results.json", cv_fold=1)
    assert summary.params["d_model"] == 32 and summary.fold == 1


@pytest.mark.parametrize(
    "content, message",
    [
        ({"d_modle": 16}, "unknown parameter 'd_modle'"),
        ({"d_model": "wide"}, "d_model: Input should be a valid integer"),
        ({"lr": "fast"}, "lr: Input should be a valid number"),
        ({"n_features": 99}, "unknown parameter 'n_features'"),
    ],
)
def test_bad_params_files_name_the_key(bars_dir, tmp_path, content, message):
    params = tmp_path / "bad.json"
    params.write_text(json.dumps(content))
    with pytest.raises(PlanError, match=message) as err:
        run(bars_dir, tmp_path, params, cv_fold=0)
    assert "bad.json" in str(err.value)


def test_cli_trains_every_fold_and_writes_the_layout(bars_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(stages_module, "_first_clock_taken", False)  # as in a fresh process: the CLI's first clock
    argv = [
        "train-supervised",
        *flags(
            model="mamba2",
            data_dir=bars_dir,
            output_dir=tmp_path / "m",
            predecoded_dir=tmp_path / "pd",
            epochs=2,
            cv_n_folds=2,
            cv_train_window=2,
            seq_len=16,
            batch_size=32,
            n_train_seqs=128,
            n_val_seqs=128,
            param="n_layers=1",
            device="cpu",
        ),
    ]
    assert main(argv) == 0
    for k in (0, 1):
        fold = tmp_path / "m" / f"fold-{k}"
        names = {p.name for p in fold.iterdir()}
        assert {n for n in names if not n.startswith("events.out.tfevents.")} == {  # + one TensorBoard event file
            "model.safetensors",
            "norm_stats.json",
            "model_config.json",
            "params.json",
            "train_config.json",
            "summary.json",
            "manifest.json",
        } and len(names) == 8
        assert fold.is_symlink() and verify(fold, deep=True) == []  # a promoted, complete attempt
        summary = json.loads((fold / "summary.json").read_text())
        assert summary["fold"] == k and summary["epochs"] == 2 and len(summary["val_auc"]) == 3
        assert summary["params"]["n_layers"] == 1
        # where the fold's seconds went (issue 33 item 1): the process's own stages on the first fold only
        stages = summary["stage_s"]
        first = {"process_start", "imports"} if k == 0 else set()
        assert set(stages) >= {"data", "build", "first_step", "epochs", "validation", "val_score", "writing", "total"} | first
        assert all(v >= 0 for v in stages.values()) and (k == 1) == ("imports" not in stages)
        assert sum(v for n, v in stages.items() if n != "total") <= stages["total"] + 5e-4 * len(stages)  # each rounded to 1 ms
    assert main(["train-supervised", *flags(model="perception", data_dir=bars_dir, output_dir=tmp_path / "p")]) == 2
    assert "is trained by `alpha train`" in capsys.readouterr().err


def test_models_json_lists_the_registry(capsys):
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"perception", "tft", "mamba2", "tggn", "tlob", "liquid", "kan", "xlstm", "diffusion", "dqn", "ppo"}
    assert {n for n, r in rows.items() if r["hyperopt"]} == {"tft", "mamba2", "dqn", "ppo"}
    assert rows["dqn"]["group"] == "rl" and rows["perception"]["input"] == "book" and rows["kan"]["input"] == "bars"
    assert rows["tft"]["hyperopt"]["lr"] == {"kind": "log", "low": 1e-4, "high": 1e-2}


def test_the_weight_average_follows_its_warmed_up_decay_and_keeps_integer_buffers():
    from alpha_core.train.supervised import WeightAverage

    model = torch.nn.Linear(2, 1)
    model.register_buffer("count", torch.zeros((), dtype=torch.long))
    average = WeightAverage(model, decay=0.9)
    want = model.weight.detach().clone()
    for step in range(1, 200):
        with torch.no_grad():
            model.weight.add_(1.0)
            model.count += 1
        average.update()
        keep = min(0.9, (1 + step) / (10 + step))  # short runs follow the model, long ones average it
        want = keep * want + (1 - keep) * model.weight.detach()
        torch.testing.assert_close(average.module.weight, want)
    assert int(average.module.count) == 199 and not average.module.weight.requires_grad
    assert float((model.weight - average.module.weight).mean()) == pytest.approx(9.0, abs=0.01)  # a ramp lags 0.9 / (1 - 0.9)


def test_the_checkpoint_written_is_the_weight_average(bars_dir, tmp_path):
    """`weight_ema` (on by default) is recorded with the checkpoint and changes the weights written (0: the trained
    weights); either way the checkpoint learns the tiny data's planted signal."""
    written = {}
    for decay in (SupervisedTrainConfig.model_fields["weight_ema"].default, 0.0):
        out = tmp_path / f"ema-{decay}"
        cfg = SupervisedTrainConfig(
            model="kan",
            data_dir=bars_dir,
            output_dir=out,
            predecoded_dir=tmp_path / "pd",
            device="cpu",
            **{**FAST, "epochs": 2, "n_train_seqs": 2048, "n_val_seqs": 1024, "cv_fold": 0},
            weight_ema=decay,
        )
        (summary,) = train_supervised(cfg)
        assert json.loads((out / "fold-0" / "train_config.json").read_text())["weight_ema"] == decay
        assert summary.val_auc[0] > 0.55, summary.val_auc  # the planted signal's first horizon
        written[decay] = load_file(str(out / "fold-0" / "model.safetensors"))
    averaged, trained = written.values()
    assert any(not torch.equal(averaged[k], trained[k]) for k in averaged)
