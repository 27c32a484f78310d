"""The settings a pipeline step takes (the Launchpad's config, `alpha run --train-config` / `--hyperopt-config`),
checked against the bounds of the config that finally uses them, without Dagster or torch: `alpha run --help` lists
them and `alpha run --dry-run` refuses an out-of-range value, as the flags' own checks do (`--epochs 0`)."""

from __future__ import annotations

from typing import Annotated

import pydantic

from alpha_core.errors import PlanError

# the fields of alpha_assets.asset_configs.TrainAssetConfig and HyperoptAssetConfig (a test keeps them equal)
STEP_KEYS = {
    "checkpoints": (
        "epochs",
        "seq_len",
        "batch_size",
        "n_train_seqs",
        "n_val_seqs",
        "timesteps_per_epoch",
        "device",
        "precision",
        "min_val_auc",
        "min_val_sharpe",
    ),
    "hyperopt": (
        "trials",
        "epochs",
        "workers",
        "seq_len",
        "batch_size",
        "n_train_seqs",
        "n_val_seqs",
        "timesteps_per_epoch",
        "device",
    ),
}
FLAGS = {"checkpoints": "--train-config", "hyperopt": "--hyperopt-config", "fold_plans": "--fold-config"}
# settings of the fold plan (alpha_assets' FoldConfig, `alpha folds`' flags), not of a step: every step of a run
# trains on its run's plan, so they are set once, on `fold_plans` (`alpha run --fold-config`, the Launchpad)
PLAN_KEYS = ("cv_train_window", "purge_sessions", "embargo_sessions")


def final_config(kind: str, trainer: str) -> type[pydantic.BaseModel]:
    """The config class that finally checks a step's settings: the search's, or the trainer's."""
    from alpha_core.gates import GateThresholds
    from alpha_core.hyperopt.configs import HyperoptConfig
    from alpha_core.train import configs
    from alpha_core.trainers import TRAINERS

    if kind == "hyperopt":
        return HyperoptConfig
    return type(
        "StepConfig", (getattr(configs, TRAINERS[trainer].config), GateThresholds), {}
    )  # the gate's thresholds are a step setting too


def check_keys(kind: str, config: dict) -> None:
    """A key no step of this kind takes: a PlanError naming the flag, the closest key and every key with its range
    (rather than Dagster's schema of the whole op)."""
    import difflib

    keys = PLAN_KEYS if kind == "fold_plans" else STEP_KEYS[kind]
    for key in config:
        if key in keys:
            continue
        if key in PLAN_KEYS:
            raise PlanError(
                f"{FLAGS[kind]}: {key} is a fold plan setting, not a step's (every step of a run trains on its run's "
                f"plan): --fold-config '{{\"{key}\": ...}}'"
            )
        close = difflib.get_close_matches(key, keys, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        listed = ", ".join(PLAN_KEYS) if kind == "fold_plans" else describe(kind)
        raise PlanError(f"{FLAGS[kind]}: unknown key {key!r}{hint}; the keys: {listed}")


def check(kind: str, trainer: str, config: dict) -> None:
    """Each value set, against the bounds of the config that will use it; a PlanError naming the flag and key."""
    fields = final_config(kind, trainer).model_fields
    for key, value in config.items():
        if value is None or key not in fields:
            continue
        field = fields[key]
        try:
            typed = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
            pydantic.TypeAdapter(typed).validate_python(value)
        except pydantic.ValidationError as exc:
            raise PlanError(f"{FLAGS[kind]}: {key}: {exc.errors()[0]['msg']} (got {value!r})") from None


def describe(kind: str) -> str:
    """The keys a step takes, with their ranges (`epochs (ge 1), ...`), for `alpha run --help`."""
    fields = final_config(kind, "supervised").model_fields
    out = []
    for key in STEP_KEYS[kind]:
        limits = [
            (op, getattr(m, op, None)) for m in getattr(fields.get(key), "metadata", []) for op in ("ge", "gt", "le", "lt")
        ]
        bounds = [f"{op} {v}" for op, v in limits if v is not None and abs(v) < 1e9]  # int32's end is no advice
        out.append(key + (f" ({', '.join(bounds)})" if bounds else ""))
    return ", ".join(out)
