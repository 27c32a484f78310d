"""The Launchpad configs of the training lineage's assets, and how a config reaches the trainer's own config.

A value left unset is the CLI trainer's own default, so the UI, the scheduled retrain, `alpha run` and the original
commands train alike; each value is checked by the trainer's config (and by `alpha run` before it launches).
"""

import dagster as dg

from alpha_core.gates import GateThresholds


class TrainAssetConfig(dg.Config):
    """Launchpad settings of a checkpoint. A value left unset is the CLI trainer's own default (EPOCHS 50 for the
    ensemble, the flagship's original defaults, ...), so the UI, the scheduled retrain, `alpha run` and the original
    commands train alike; each value is checked by the trainer's own config."""

    epochs: int | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    n_train_seqs: int | None = None
    n_val_seqs: int | None = None
    timesteps_per_epoch: int | None = None  # RL agents
    device: str | None = None
    precision: str | None = None  # fp32 | bf16 (the flagship; bf16 autocast)
    min_val_auc: float = GateThresholds().min_val_auc  # gate: mean validation AUC must be above this
    min_val_sharpe: float = GateThresholds().min_val_sharpe  # RL gate: validation Sharpe must be above this


class HyperoptAssetConfig(dg.Config):
    """Launchpad settings of a search; unset values are `alpha hyperopt`'s defaults (HYPEROPT_TRIALS 20, ...)."""

    trials: int | None = None
    epochs: int | None = None
    workers: int | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    n_train_seqs: int | None = None
    n_val_seqs: int | None = None
    timesteps_per_epoch: int | None = None
    device: str | None = None


class CPUTrainAssetConfig(TrainAssetConfig):
    """A checkpoint of a model placed on CPU pods (`alpha_assets.execution.placement`): the CPU by default."""

    device: str | None = "cpu"


class CPUHyperoptAssetConfig(HyperoptAssetConfig):
    device: str | None = "cpu"


class ReportConfig(dg.Config):
    """The models this report must account for (every registry model by default); `alpha run` sets them."""

    models: list[str] | None = None


class CostConfig(dg.Config):
    eur_per_gpu_hour: float = 3.0  # the original system's H100 figure
    eur_per_cpu_hour: float = 0.5  # an assumption: one 16-vCPU node, where the RL steps run (deploy/README.md)


class ComparisonConfig(dg.Config):
    """The runs to set side by side (RUN_IDs under the storage root), as `alpha compare` takes them."""

    runs: list[str] = []  # a default, so that no other job's run config must name it; fewer than two fail the step


def given(config: dg.Config, fields) -> dict:
    """The settings of `config` that are set and that a trainer's config has (`fields`); the rest keep its default."""
    return {k: v for k, v in config.model_dump().items() if v is not None and k in fields}
