"""Every parameter is bounded: NaN, inf, -1, 0, 1e308 and negative batches are refused with the key named, in the
configs themselves (what Dagster builds), through CLI flags and `--param`, and through params files, before any
training output is written."""

from __future__ import annotations

import json
import math
import types
import typing

import pytest
from pydantic import BaseModel, ValidationError

from alpha_core.cli import main
from alpha_core.errors import PlanError, describe_validation_error
from alpha_core.eval.evaluate import EvalConfig
from alpha_core.hyperopt.pso import HyperoptConfig
from alpha_core.models.mamba2 import Mamba2Config
from alpha_core.models.registry import REGISTRY
from alpha_core.rl.env import EnvConfig
from alpha_core.train.perception import TrainConfig, validate
from alpha_core.train.rl import AGENT_CONFIGS, RLTrainConfig
from alpha_core.train.supervised import SupervisedTrainConfig

REQUIRED = {
    TrainConfig: {"mbp10_data_dir": "d", "predecoded_dir": "p", "out": "o"},
    SupervisedTrainConfig: {"model": "tft", "data_dir": "d", "output_dir": "o"},
    RLTrainConfig: {"model": "ppo", "data_dir": "d", "output_dir": "o"},
    HyperoptConfig: {"model": "tft", "data_dir": "d", "output": "o.json"},
    EvalConfig: {"models_dir": "m", "data_dir": "d", "output": "o.json"},
    EnvConfig: {},
    Mamba2Config: {},
    **{cls: {} for cls in AGENT_CONFIGS.values()},
    **{spec.config_class(): {"n_features": 8} for spec in REGISTRY.values() if spec.trainer != "rl"},
}


def _scalar_kind(annotation) -> type | None:
    """int or float for a (possibly Optional / Annotated) scalar number field, else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _scalar_kind(inner[0]) if len(inner) == 1 else None
    if typing.get_origin(annotation) is typing.Annotated:
        return _scalar_kind(typing.get_args(annotation)[0])
    return annotation if annotation in (int, float) else None


NUMERIC_FIELDS = [
    (cls, name, kind)
    for cls in REQUIRED
    for name, field in cls.model_fields.items()
    if (kind := _scalar_kind(field.annotation)) is not None
]


def _build(cls: type[BaseModel], **values) -> BaseModel:
    cfg = cls(**{**REQUIRED[cls], **values})
    if cls is TrainConfig:  # the original system's fold checks keep their own messages, before any work
        validate(cfg)
    return cfg


def test_every_config_class_is_covered():
    assert len(REQUIRED) >= 17 and len(NUMERIC_FIELDS) > 100
    for cls in REQUIRED:
        _build(cls)  # the defaults are within the bounds


@pytest.mark.parametrize("cls", list(REQUIRED), ids=lambda cls: cls.__name__)
def test_every_number_refuses_nan_inf_and_huge_values_naming_its_key(cls):
    """Each numeric field of the class, with NaN, inf, 1e308 and -1e308: refused, naming the field."""
    accepted, unnamed = [], []
    for field, kind in [(name, kind) for c, name, kind in NUMERIC_FIELDS if c is cls]:
        for bad in (math.nan, math.inf, 1e308, -1e308):
            value = str(bad) if kind is int and not math.isfinite(bad) else bad  # an int field given "nan" text
            try:
                _build(cls, **{field: value})
            except (ValidationError, PlanError) as err:
                message = describe_validation_error(err)
                if field not in message and field.replace("_", "-") not in message:
                    unnamed.append((field, bad, message))
            else:
                accepted.append((field, bad))
    assert accepted == [] and unnamed == []


@pytest.mark.parametrize(
    "cls, name, value",
    [
        (SupervisedTrainConfig, "lr", 0.0),
        (SupervisedTrainConfig, "lr", -1.0),
        (SupervisedTrainConfig, "batch_size", 0),
        (SupervisedTrainConfig, "batch_size", -1),
        (SupervisedTrainConfig, "seq_len", 0),
        (SupervisedTrainConfig, "lr_min_factor", -3.0),
        (SupervisedTrainConfig, "lr_min_factor", 1.5),
        (SupervisedTrainConfig, "weight_decay", -0.1),
        (SupervisedTrainConfig, "weight_ema", 1.0),  # an average that never moves
        (SupervisedTrainConfig, "weight_ema", -0.5),
        (SupervisedTrainConfig, "early_stop_patience", -1),
        (SupervisedTrainConfig, "n_train_seqs", 0),
        (SupervisedTrainConfig, "epochs", 0),
        (TrainConfig, "lr_cfc", 0.0),
        (TrainConfig, "lr_mamba2", 2.0),
        (TrainConfig, "batch_size", -5),
        (TrainConfig, "seq_len", 1),
        (TrainConfig, "n_val_seqs", 0),
        (TrainConfig, "lr_min_factor", -3.0),
        (TrainConfig, "cv_n_folds", 0),
        (TrainConfig, "cv_train_window", -1),
        (TrainConfig, "outcome_label_cost", -0.5),
        (HyperoptConfig, "trials", 0),
        (HyperoptConfig, "workers", 0),
        (EvalConfig, "band", 0.5),
        (EvalConfig, "band", -0.01),
        (EvalConfig, "cost_ticks", -1.0),
        (EvalConfig, "horizon", -1),
        (RLTrainConfig, "n_envs", 0),
        (RLTrainConfig, "cost_per_turnover", -1.0),
        (AGENT_CONFIGS["ppo"], "gamma", 0.0),
        (AGENT_CONFIGS["dqn"], "gamma", 1.5),
        (AGENT_CONFIGS["ppo"], "learning_rate", 0.0),
        (REGISTRY["tft"].config_class(), "dropout", 1.0),
        (REGISTRY["tlob"].config_class(), "d_model", 0),
        (REGISTRY["xlstm"].config_class(), "dropout", -0.1),
        (REGISTRY["mamba2"].config_class(), "n_layers", 0),
    ],
)
def test_out_of_range_values_are_refused_naming_the_key(cls, name, value):
    with pytest.raises((ValidationError, PlanError)) as err:
        _build(cls, **{name: value})
    message = describe_validation_error(err.value)
    assert name in message or name.replace("_", "-") in message, message


def test_bound_messages_say_the_bound_and_the_value():
    with pytest.raises(ValidationError) as err:
        SupervisedTrainConfig(**REQUIRED[SupervisedTrainConfig], lr=-1, batch_size=0)
    assert describe_validation_error(err.value) == "batch_size must be >= 1 (got 0); lr must be > 0.0 (got -1)"
    with pytest.raises(ValidationError) as err:
        SupervisedTrainConfig(**REQUIRED[SupervisedTrainConfig], device="gpu0")
    assert describe_validation_error(err.value).startswith("device: String should match pattern")


# --- through the command line ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def es(tiny_data):
    return tiny_data / "ES.FUT"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("params-cache")


def _alpha(capsys, argv) -> tuple[int, str]:
    """Exit code and stderr of `alpha argv`, without the one-line warnings (e.g. a fold plan without test files)."""
    code = main(argv)
    err = capsys.readouterr().err
    return code, "".join(line for line in err.splitlines(keepends=True) if ": warning: " not in line)


@pytest.mark.parametrize(
    "command, flags, key",
    [
        ("train", ["--lr-cfc", "nan"], "lr_cfc"),
        ("train", ["--lr-cfc", "-1"], "lr_cfc"),
        ("train", ["--lr-mamba2", "1e308"], "lr_mamba2"),
        ("train", ["--batch-size", "0"], "batch_size"),
        ("train", ["--batch-size", "-1"], "batch_size"),
        ("train", ["--lr-min-factor", "-3"], "lr_min_factor"),
        ("train", ["--epochs", "0"], "epochs"),
        ("train-supervised", ["--lr", "nan"], "lr"),
        ("train-supervised", ["--lr", "-1"], "lr"),
        ("train-supervised", ["--lr", "1e308"], "lr"),
        ("train-supervised", ["--batch-size", "-4"], "batch_size"),
        ("train-supervised", ["--n-train-seqs", "0"], "n_train_seqs"),
        ("train-supervised", ["--param", "lr=NaN"], "lr"),
        ("train-supervised", ["--param", "dropout=1.0"], "dropout"),
        ("train-rl", ["--cost-per-turnover", "inf"], "cost_per_turnover"),
        ("train-rl", ["--n-envs", "0"], "n_envs"),
        ("train-rl", ["--param", "learning_rate=1e308"], "learning_rate"),
        ("train-rl", ["--param", "gamma=0"], "gamma"),
        ("hyperopt", ["--trials", "0"], "trials"),
        ("hyperopt", ["--workers", "-1"], "workers"),
        ("hyperopt", ["--batch-size", "-1"], "batch_size"),
        ("evaluate", ["--band", "0.5"], "band"),
        ("evaluate", ["--cost-ticks", "nan"], "cost_ticks"),
        ("evaluate", ["--horizon", "-1"], "horizon"),
        ("evaluate", ["--min-val-auc", "1.5"], "min_val_auc"),
        ("evaluate", ["--min-val-sharpe", "nan"], "min_val_sharpe"),
    ],
)
def test_hostile_flags_exit_2_naming_the_key_before_any_output(capsys, tmp_path, es, cache, command, flags, key):
    out = tmp_path / "out"
    argv = {
        "train": ["train", "--mbp10-data-dir", str(es / "mbp-10"), "--predecoded-dir", str(cache), "--out", str(out)],
        "train-supervised": [
            "train-supervised",
            "--model",
            "tft",
            "--data-dir",
            str(es),
            "--output-dir",
            str(out),
            "--predecoded-dir",
            str(cache),
        ],
        "train-rl": [
            "train-rl",
            "--model",
            "ppo",
            "--data-dir",
            str(es),
            "--output-dir",
            str(out),
            "--predecoded-dir",
            str(cache),
        ],
        "hyperopt": [
            "hyperopt",
            "--model",
            "tft",
            "--data-dir",
            str(es),
            "--output",
            str(out / "results.json"),
            "--predecoded-dir",
            str(cache),
        ],
        "evaluate": [
            "evaluate",
            "--models-dir",
            str(tmp_path),
            "--data-dir",
            str(es.parent),
            "--output",
            str(out / "report.json"),
            "--predecoded-dir",
            str(cache),
        ],
    }[command]
    code, err = _alpha(capsys, [*argv, *flags, "--device", "cpu"])
    assert code == 2, err
    assert err.startswith(f"alpha {command}: error: ") and key in err and err.count("\n") == 1, err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize(
    "command, params, key",
    [
        ("train-supervised", {"lr": math.nan}, "lr"),
        ("train-supervised", {"lr": -1}, "lr"),
        ("train-supervised", {"lr": 1e308}, "lr"),
        ("train-supervised", {"batch_size": 0}, "batch_size"),
        ("train-supervised", {"batch_size": -1}, "batch_size"),  # once an endless loop
        ("train-supervised", {"lr_min_factor": -3}, "lr_min_factor"),
        ("train-supervised", {"best_params": {"d_model": 0}}, "d_model"),
        ("train-supervised", {"n_heads": 1e308}, "n_heads"),
        ("train-rl", {"learning_rate": math.nan}, "learning_rate"),
        ("train-rl", {"gamma": -1}, "gamma"),
        ("train-rl", {"batch_size": 0}, "batch_size"),
    ],
)
def test_hostile_params_files_exit_2_naming_the_key(capsys, tmp_path, es, cache, command, params, key):
    params_file, out = tmp_path / "params.json", tmp_path / "out"
    params_file.write_text(json.dumps(params))  # NaN is written as the JSON extension `NaN`
    model = "tft" if command == "train-supervised" else "ppo"
    code, err = _alpha(
        capsys,
        [
            command,
            "--model",
            model,
            "--data-dir",
            str(es),
            "--output-dir",
            str(out),
            "--predecoded-dir",
            str(cache),
            "--params-file",
            str(params_file),
            "--device",
            "cpu",
            "--epochs",
            "1",
        ],
    )
    assert code == 2, err
    assert str(params_file) in err and key in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "command, flags, message",
    [
        (
            "train-supervised",
            ["--model", "tft", "--batch-size", "2000000000", "--seq-len", "64"],
            "batch_size x seq_len x n_features = 2000000000 x 64 x",
        ),
        (
            "train-rl",
            ["--model", "ppo", "--n-envs", "1000000000", "--window", "64"],
            "n_envs x window x n_features = 1000000000 x 64 x",
        ),
    ],
)
def test_a_batch_that_cannot_fit_in_memory_is_refused(capsys, tmp_path, es, cache, command, flags, message):
    out = tmp_path / "out"
    code, err = _alpha(
        capsys,
        [command, *flags, "--data-dir", str(es), "--output-dir", str(out), "--predecoded-dir", str(cache), "--device", "cpu"],
    )
    assert code == 2 and message in err and "elements in one batch (limit 2**31)" in err, err
    assert not out.exists()


@pytest.mark.slow
def test_a_missing_params_file_trains_on_defaults_and_says_so_in_one_line(capsys, tmp_path, es, cache):
    """The original system trains on defaults when the params file is absent: a mistyped path must not go unseen."""
    missing = tmp_path / "hyperopt" / "results.json"
    argv = ["train-supervised", "--model", "tft", "--data-dir", str(es), "--output-dir", str(tmp_path / "out")]
    small = ["--epochs", "1", "--n-train-seqs", "64", "--n-val-seqs", "32", "--seq-len", "16", "--batch-size", "32"]
    flags = ["--predecoded-dir", str(cache), "--cv-n-folds", "1", "--param", "d_model=8", "--param", "n_heads=2"]
    code = main([*argv, *small, *flags, "--params-file", str(missing), "--device", "cpu"])
    err = capsys.readouterr().err
    notices = [line for line in err.splitlines() if str(missing) in line]
    assert code == 0, err
    assert notices == [f"alpha train-supervised: warning: {missing}: no such params file; training with the default parameters"]
