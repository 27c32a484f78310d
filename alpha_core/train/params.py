"""Parameter precedence of the spec: compiled defaults < params file (if it exists) < explicit CLI/config values.

A params file is a flat JSON object of model-config and training keys, or a hyperopt `results.json` (its
`best_params` are used). A missing file means defaults; unknown keys and wrong types are errors naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ValidationError

from alpha_core.errors import PlanError, describe_validation_error

# training keys a params file (or hyperopt) may set; the rest of a run's settings are not hyperparameters
TRAIN_KEYS = ("lr", "weight_decay", "batch_size", "seq_len", "lr_warmup_steps", "lr_min_factor")
FIXED_MODEL_KEYS = ("n_features", "horizons")  # taken from the data, never from a params file


def load_params_file(path: str | Path | None) -> dict:
    if path is None or not Path(path).exists():
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path}: not a JSON params file ({exc})") from exc
    if isinstance(data, dict) and "best_params" in data:
        data = data["best_params"]
    if not isinstance(data, dict):
        raise PlanError(f"{path}: a params file must hold a JSON object of parameters")
    return data


def split_params(params: dict, model_config: type[BaseModel], source: str) -> tuple[dict, dict]:
    """Split into (model config values, training values); unknown keys name the key and the accepted ones."""
    model_keys = set(model_config.model_fields) - set(FIXED_MODEL_KEYS)
    model, train = {}, {}
    for key, value in params.items():
        if key in model_keys:
            model[key] = value
        elif key in TRAIN_KEYS:
            train[key] = value
        else:
            accepted = ", ".join(sorted(model_keys | set(TRAIN_KEYS)))
            raise PlanError(f"{source}: unknown parameter {key!r} (accepted: {accepted})")
    return model, train


def resolve(model_config: type[BaseModel], data_fields: dict, file_params: dict, explicit: dict,
            params_source: str) -> tuple[BaseModel, dict]:
    """The model config (defaults < file < explicit) and the training overrides (file < explicit)."""
    file_model, file_train = split_params(file_params, model_config, params_source)
    cli_model, cli_train = split_params(explicit, model_config, "command line")
    for source, values in ((params_source, file_model), ("command line", {**file_model, **cli_model})):
        try:
            cfg = model_config(**{**values, **data_fields})
        except ValidationError as exc:
            raise PlanError(f"{source}: {describe_validation_error(exc)}") from exc
    return cfg, {**file_train, **cli_train}
