"""The trainers' settings, apart from the trainers: `alpha <command> --help` builds its options from these
classes (each default written once, here) without importing torch. The trainer modules import them from here;
`alpha_core.train.perception.TrainConfig`, `...supervised.SupervisedTrainConfig` and `...rl.RLTrainConfig`
remain importable where they were."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from alpha_core.bounds import (
    MAX_COUNT,
    Count,
    Decay,
    Device,
    Dim,
    GapSessions,
    LearningRate,
    NonNegFloat,
    NonNegInt,
    Seed,
    UnitFloat,
)
from alpha_core.data.folds import EMBARGO_SESSIONS, N_FOLDS, PURGE_SESSIONS
from alpha_core.metrics import DEFAULT_COST_TICKS
from alpha_core.train.walk_forward import WalkForwardConfig


class TrainConfig(BaseModel):
    """Every flag of the original system's `alpha_train`, same names and defaults, plus device/resume/precision."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mbp10_data_dir: Path
    predecoded_dir: Path
    out: Path
    epochs: Count = 5
    seq_len: int = Field(64, ge=2, le=MAX_COUNT)
    mamba2_state_dim: Dim = 16
    lr_cfc: LearningRate = 3e-3
    lr_mamba2: LearningRate = 1e-3
    lr_aux: LearningRate | None = None  # the original system's aux group follows lr_cfc unless set
    n_train_seqs: Count = 8000
    n_val_seqs: Count = 1000
    seed: Seed = 0x4242
    lr_warmup_steps: NonNegInt = 200
    lr_min_factor: UnitFloat = 0.1
    early_stop_patience: NonNegInt = 5
    early_stop_metric: str = "mean_auc"
    horizon_weights: str | None = None
    auto_horizon_weights: bool = False
    batch_size: Count = 1
    val_batch_size: Count = 4096  # validation (no gradients) batches, whatever batch_size trains at
    cv_fold: NonNegInt | None = None  # None: every fold of the plan, each into `out/fold-<k>`
    cv_n_folds: int = Field(N_FOLDS, le=MAX_COUNT)  # validate() checks the lower bounds with the original system's messages
    cv_train_window: int = Field(0, le=MAX_COUNT)
    allow_untested_folds: bool = False  # a fold without a test file is an explicit opt-in
    purge_sessions: GapSessions = PURGE_SESSIONS  # sessions dropped from training before validation (folds.py)
    embargo_sessions: GapSessions = EMBARGO_SESSIONS  # sessions not scored at a validation and a test quarter's start
    smoothness_base_lambda: NonNegFloat = 0.0
    kernel_step_trace: Path | None = None
    bucket_warmup_cap_steps: NonNegInt | None = None
    outcome_label_cost: NonNegFloat | None = None  # None: 2 ticks of the product (0.5 for ES, the original system's default)
    device: Device | None = None  # None: cuda when available
    resume: bool = False
    precision: Literal["fp32", "bf16"] = "fp32"
    # the GPU fast path, on by default on cuda (None), off on the CPU: at batch 1 an uncompiled step waits on ~160
    # kernel launches from Python, 2x slower than the captured graph on the demo and 30x on a real-scale book
    cuda_graph: bool | None = None  # capture the whole training step in one CUDA graph (cuda only)
    compile: bool | None = None  # torch.compile the forward + loss (cuda only; cached, see compile_cache)
    fused_scan: bool = True  # on cuda: each CfC scan as one Triton kernel per direction, where triton and sizes allow


class SupervisedTrainConfig(WalkForwardConfig):
    model: str
    seq_len: Count = 64
    batch_size: Count = 256
    val_batch_size: Count = 4096  # validation (no gradients) batches, whatever batch_size trains at
    n_train_seqs: Count = 20_000
    n_val_seqs: Count = 5_000
    lr: LearningRate = 1e-3
    weight_decay: NonNegFloat = 0.01
    lr_warmup_steps: NonNegInt = 100
    lr_min_factor: UnitFloat = 0.1
    # each step, the weights that are validated and written move this close to their previous value (an
    # exponential moving average of the trained weights; 0: the trained weights themselves), see supervised.py
    weight_ema: Decay = 0.99
    early_stop_metric: str = "mean_auc"
    allow_hyperopt_leakage: bool = False  # train on params searched on a test file (recorded; never reported)


class RLTrainConfig(WalkForwardConfig):
    model: Literal["dqn", "ppo"]
    timesteps_per_epoch: Count = 20_000
    window: Count = 32
    episode_len: Count = 256
    n_envs: Count = 8
    cost_per_turnover: NonNegFloat = DEFAULT_COST_TICKS  # ticks per unit of position change: the evaluator's cost
    allow_hyperopt_leakage: bool = False  # train on params searched on a test file (recorded; never reported)
    # each epoch's validation scores at most this many sessions (a fixed seeded subset; None: every session), so an
    # epoch's cost does not grow with the validation file; the kept policy is scored on the whole files once
    val_sessions_per_epoch: Count | None = 20
