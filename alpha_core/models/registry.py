"""One registry of every model: name -> group, input, config class with defaults, builder, search space.

Adding a model is one entry here; the CLI (`alpha models`, `alpha train-supervised`, `alpha hyperopt`) and the
Dagster assets are generated from it. A spec is data (listing the registry imports no torch); its config class and
builder are imported when a model is built. Supervised models map a window x [B, K, F] to causal
per-horizon logits [B, K, H] and may add the optional hooks of `alpha_core.models.hooks` (their own loss, a
sampling forward, the last position only, ...). RL models are built by the RL trainer from their config.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from alpha_core.errors import PlanError
from alpha_core.trainers import TRAINERS, Trainer

if TYPE_CHECKING:  # the specs are data: listing them (`alpha models`) never imports torch
    from torch import nn


class SearchParam(BaseModel):
    """One hyperparameter's range: log-uniform or uniform floats, integers, or a set of choices."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["log", "float", "int", "choice"]
    low: float | None = None
    high: float | None = None
    choices: list[float | int | str] | None = Field(default=None)


def log(low: float, high: float) -> SearchParam:
    return SearchParam(kind="log", low=low, high=high)


def integer(low: int, high: int) -> SearchParam:
    return SearchParam(kind="int", low=low, high=high)


def choice(*values: float | int | str) -> SearchParam:
    return SearchParam(kind="choice", choices=list(values))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    group: Literal["supervised", "rl"]
    input: Literal["book", "bars"]
    module: str  # alpha_core.models.<module> (imported on use: a listing does not import torch models)
    config_name: str
    model_name: str
    trainer: Literal["perception", "supervised", "rl"]
    description: str
    search_space: dict[str, SearchParam] | None = field(default=None)
    # bump when a change alters what training this model produces: its Dagster checkpoints then show as stale
    # (2: TF32 matmuls on CUDA for every trainer, the flagship's fused CfC scan)
    code_version: str = "2"

    @property
    def kind(self) -> Trainer:
        """How this model is trained, gated, scored and loaded (`alpha_core.trainers`); `trainer` is its name."""
        return TRAINERS[self.trainer]

    def config_class(self) -> type[BaseModel]:
        return getattr(importlib.import_module(self.module), self.config_name)

    def builder(self) -> Callable[[BaseModel], nn.Module]:
        return getattr(importlib.import_module(self.module), self.model_name)

    def build(self, **config) -> nn.Module:
        """A supervised model from its config values (RL agents need an environment: see alpha_core.train.rl)."""
        return self.builder()(self.config_class()(**config))


_SUPERVISED_LR = {"lr": log(1e-4, 1e-2)}
_ENTRIES = [
    ModelSpec(
        "perception",
        "supervised",
        "book",
        "alpha_core.models.perception",
        "PerceptionConfig",
        "PerceptionModel",
        "perception",
        "flagship: Mamba2 -> CfC (irregular time) -> heads, aux outcome path",
    ),
    ModelSpec(
        "tft",
        "supervised",
        "bars",
        "alpha_core.models.tft",
        "TFTConfig",
        "TFTModel",
        "supervised",
        "Temporal Fusion Transformer: variable selection, GRNs, LSTM, causal interpretable attention",
        {**_SUPERVISED_LR, "d_model": choice(16, 32, 64), "n_heads": choice(1, 2, 4)},
        code_version="3",  # 3: the weights written are averaged (weight_ema)
    ),
    ModelSpec(
        "mamba2",
        "supervised",
        "bars",
        "alpha_core.models.mamba2_stack",
        "Mamba2StackConfig",
        "Mamba2StackModel",
        "supervised",
        "stacked Mamba2 (chunked SSD) blocks with heads",
        {**_SUPERVISED_LR, "d_model": choice(32, 64, 96), "d_state": choice(8, 16, 32), "n_layers": integer(1, 3)},
        code_version="3",  # 3: the weights written are averaged (weight_ema)
    ),
    ModelSpec(
        "tggn",
        "supervised",
        "bars",
        "alpha_core.models.tggn",
        "TGGNConfig",
        "TGGNModel",
        "supervised",
        "temporal gated graph network: GGNN steps over the features, gated causal temporal convs",
        code_version="3",  # 3: the weights written are averaged (weight_ema)
    ),
    ModelSpec(
        "tlob",
        "supervised",
        "bars",
        "alpha_core.models.tlob",
        "TLOBConfig",
        "TLOBModel",
        "supervised",
        "TLOB: causal dual attention over time and over features",
        code_version="4",  # 4: weights averaged (weight_ema); 3: its feature attention runs SDPA's fused kernel
    ),
    ModelSpec(
        "liquid",
        "supervised",
        "bars",
        "alpha_core.models.liquid",
        "LiquidConfig",
        "LiquidModel",
        "supervised",
        "liquid time-constant network (ncps LTC)",
        code_version="3",  # 3: the weights written are averaged (weight_ema)
    ),
    ModelSpec(
        "kan",
        "supervised",
        "bars",
        "alpha_core.models.kan",
        "KANConfig",
        "KANModel",
        "supervised",
        "B-spline KAN layers over causal EMA summaries",
        code_version="3",  # 3: the weights written are averaged (weight_ema)
    ),
    ModelSpec(
        "xlstm",
        "supervised",
        "bars",
        "alpha_core.models.xlstm",
        "XLSTMConfig",
        "XLSTMModel",
        "supervised",
        "xLSTM: mLSTM (parallel form) and sLSTM blocks",
        code_version="4",  # 4: weights averaged (weight_ema); 3: on CUDA its sLSTM runs as fused Triton kernels
    ),
    ModelSpec(
        "diffusion",
        "supervised",
        "bars",
        "alpha_core.models.diffusion",
        "DiffusionConfig",
        "DiffusionModel",
        "supervised",
        "conditional DDPM over forward moves; P(up) from samples",
        code_version="3",  # 3: the weights written are averaged (weight_ema)
    ),
]
_ENTRIES += [
    ModelSpec(
        "dqn",
        "rl",
        "bars",
        "alpha_core.rl.agents",
        "DQNConfig",
        "build_agent",
        "rl",
        "DQN (stable-baselines3) on the batched trading environment: short/flat/long",
        {
            "learning_rate": log(3e-5, 1e-3),  # around the default 1e-4: above ~1e-3 DQN fits the noise (docs/models.md)
            "gamma": choice(0.5, 0.9, 0.99),
            "exploration_fraction": SearchParam(kind="float", low=0.1, high=0.5),
        },
        code_version="3",  # 3: learning rate 1e-4 and an update every 4 vectorised steps (issue 31 item 8)
    ),
    ModelSpec(
        "ppo",
        "rl",
        "bars",
        "alpha_core.rl.agents",
        "PPOConfig",
        "build_agent",
        "rl",
        "PPO (stable-baselines3) on the batched trading environment: short/flat/long",
        {"learning_rate": log(1e-4, 1e-3), "ent_coef": log(1e-4, 5e-2), "gamma": choice(0.5, 0.9, 0.99)},
    ),
]
REGISTRY: dict[str, ModelSpec] = {spec.name: spec for spec in _ENTRIES}


def get(name: str) -> ModelSpec:
    if name not in REGISTRY:
        raise PlanError(f"unknown model {name!r}; registered: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def select(models: str) -> list[str]:
    """The original system's MODELS variable: `all`, `rl`, `supervised`, or a comma-separated list of names."""
    if models in ("all", "rl", "supervised"):
        return [n for n, s in REGISTRY.items() if models == "all" or s.group == models]
    names = [m.strip() for m in models.split(",") if m.strip()]
    for name in names:
        get(name)
    return names
