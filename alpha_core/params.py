"""Parameter precedence of the original system: compiled defaults < params file (if it exists) < explicit CLI/config values,
and the lineage of a params file that came out of a hyperparameter search.

A params file is a flat JSON object of model-config and training keys, or a hyperopt `results.json` (its
`best_params` are used; a file with `best_params` and none of a search's fields is plain params). A missing file
means defaults; unknown keys and wrong types are errors naming the key. Every value in the file is validated,
also those an explicit value overrides.

A hyperopt `results.json` says which model it searched, which files it trained and validated on and, for a
nested search, the one fold it was tuned for. `check_isolation` applies that where the params are used: a
trainer refuses params of another model, params of a nested search for another fold, and params searched on
a test file of the fold it trains (unless explicitly allowed, which the fold's summary records and
`alpha evaluate` reports). Each summary keeps the search's `HyperoptRecord`, so the report finds the trials
behind a checkpoint (the DSR's N and V) from the checkpoint itself, whichever door trained it.

The search signs its output: `signature` is the sha256 of its lineage, best params and trials (`search_signature`),
checked where the params are used, so trials cannot be dropped nor params edited without the file saying so. Params
copied out of a search into a plain file carry no record: training accepts them, and `alpha evaluate` marks the row
"search unknown" with its DSR at an assumed number of trials (`evaluate.ASSUMED_SEARCH_TRIALS`).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from alpha_core.errors import PlanError, describe_validation_error
from alpha_core.hashing import file_sha256

# training keys a params file (or hyperopt) may set; the rest of a run's settings are not hyperparameters
TRAIN_KEYS = ("lr", "weight_decay", "batch_size", "seq_len", "lr_warmup_steps", "lr_min_factor")
FIXED_MODEL_KEYS = ("n_features", "horizons")  # taken from the data, never from a params file
MAX_PARAMS_BYTES = 1 << 20  # a params file is a few hundred bytes; a results.json of many trials a few hundred KB


SIGNED_KEYS = ("model", "cv_fold", "train_files", "val_files", "best_params", "trials")


def search_signature(results: dict) -> str:
    """sha256 of a results.json's lineage, best params and trials, as canonical JSON (sorted keys)."""
    signed = {key: results.get(key) for key in SIGNED_KEYS}
    return hashlib.sha256(json.dumps(signed, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class HyperoptRecord(BaseModel):
    """What a checkpoint's summary keeps of the search behind its params (alpha_core.hyperopt.pso results)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    sha256: str
    model: str
    cv_fold: int | None  # a nested search: tuned for this fold only
    train_files: list[str]
    val_files: list[str]
    trial_sharpes: list[float]  # each trial's annualised daily-session Sharpe on its validation file
    trial_sessions: list[int]  # the sessions each of those Sharpes was measured on


@dataclass
class ParamsFile:
    """The parameters of a `--params-file` and, for a hyperopt results.json, the search behind them."""

    values: dict = field(default_factory=dict)
    path: str | None = None
    hyperopt: HyperoptRecord | None = None


def load_params_file(path: str | Path | None) -> ParamsFile:
    """The params of `path`; a missing file means the defaults, as in the original system, said in one line (a
    mistyped path would otherwise train on defaults without a word)."""
    if path is None:
        return ParamsFile()
    if not Path(path).exists():
        warnings.warn(f"{path}: no such params file; training with the default parameters", stacklevel=2)
        return ParamsFile()
    path = Path(path)
    try:
        if path.stat().st_size > MAX_PARAMS_BYTES:
            raise PlanError(f"{path}: {path.stat().st_size} bytes is not a params file (at most {MAX_PARAMS_BYTES})")
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested beyond Python's stack
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise PlanError(f"{path}: not a JSON params file ({reason})") from exc
    if isinstance(data, dict) and "best_params" in data:  # a search's results (with its lineage), or params alone
        searched = any(key in data for key in ("trials", "train_files", "val_files", "model"))
        return ParamsFile(
            _flat(data["best_params"], path, "best_params"), str(path), _hyperopt_record(data, path) if searched else None
        )
    return ParamsFile(_flat(data, path, None), str(path))


def _flat(values, path: Path, where: str | None) -> dict:
    """Parameters are a flat object of scalars (or short lists of them): anything else names the key."""
    if not isinstance(values, dict):
        raise PlanError(f"{path}: {where or 'a params file'} must be a JSON object of parameters")
    for key, value in values.items():
        items = value if isinstance(value, list) else [value]
        if not all(v is None or isinstance(v, bool | int | float | str) for v in items):
            raise PlanError(f"{path}: {f'{where}.' if where else ''}{key}: expected a number, string or bool")
    return values


def _hyperopt_record(results: dict, path: Path) -> HyperoptRecord:
    """The lineage fields of a results.json; one missing or malformed names the field, and so does a signature that
    does not match its contents."""
    if results.get("signature") != search_signature(results):
        what = "has no signature" if "signature" not in results else "does not match its best_params and trials"
        raise PlanError(f"{path}: signature: {what} (edited after the search, or written by an older alpha: re-run hyperopt)")
    trials = results.get("trials")
    if not isinstance(trials, list) or not trials:
        raise PlanError(f"{path}: trials: expected the non-empty list of hyperopt trials")
    sharpes, sessions = [], []
    for i, trial in enumerate(trials):
        value = trial.get("val_sharpe") if isinstance(trial, dict) else None
        count = trial.get("val_sessions") if isinstance(trial, dict) else None
        if not isinstance(value, int | float) or isinstance(value, bool) or not isinstance(count, int) or count < 1:
            raise PlanError(
                f"{path}: trials[{i}]: expected val_sharpe and val_sessions (results from an older alpha: re-run hyperopt)"
            )
        sharpes.append(float(value))
        sessions.append(count)
    try:
        return HyperoptRecord(
            path=str(Path(path).resolve()),
            sha256=file_sha256(path),
            model=results.get("model"),
            cv_fold=results.get("cv_fold"),
            train_files=results.get("train_files"),
            val_files=results.get("val_files"),
            trial_sharpes=sharpes,
            trial_sessions=sessions,
        )
    except ValidationError as exc:
        raise PlanError(f"{path}: {describe_validation_error(exc)}") from exc


def check_isolation(params: ParamsFile, model: str, fold: int, test_files: list[str], allow_leakage: bool = False) -> list[str]:
    """Refuse hyperopt params that must not train `model`'s fold `fold`; return the leaks `allow_leakage` let
    through (the summary records them). Plain params files carry no lineage and pass."""
    record = params.hyperopt
    if record is None:
        return []
    if record.model != model:
        raise PlanError(f"{params.path}: hyperopt results of model {record.model!r} cannot train {model!r}")
    if record.cv_fold is not None and record.cv_fold != fold:
        raise PlanError(
            f"{params.path}: a nested search tuned for fold {record.cv_fold} cannot train fold {fold} "
            f"(its quarters include earlier folds' test quarters; search each fold with --cv-fold, or once "
            f"per symbol without it)"
        )
    leaks = [
        f"fold {fold}: test quarter {name} was a hyperopt {split} quarter"
        for name in test_files
        for split, names in (("training", record.train_files), ("validation", record.val_files))
        if name in names
    ]
    if leaks and not allow_leakage:
        raise PlanError(
            f"{params.path}: {'; '.join(leaks)}: params searched on a test quarter would score it out of "
            f"sample (re-run hyperopt with the same fold plan, or pass --allow-hyperopt-leakage to train "
            f"anyway; the report then excludes the fold)"
        )
    return leaks


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


def resolve(
    model_config: type[BaseModel], data_fields: dict, file_params: dict, explicit: dict, params_source: str
) -> tuple[BaseModel, dict, dict]:
    """The model config (defaults < file < explicit), and the training values of the file and of the command
    line apart: each source is validated on its own, so a bad value in the file is an error even when the
    command line overrides it."""
    file_model, file_train = split_params(file_params, model_config, params_source)
    cli_model, cli_train = split_params(explicit, model_config, "command line")
    for source, values in ((params_source, file_model), ("command line", {**file_model, **cli_model})):
        try:
            cfg = model_config(**{**values, **data_fields})
        except ValidationError as exc:
            raise PlanError(f"{source}: {describe_validation_error(exc)}") from exc
    return cfg, file_train, cli_train
