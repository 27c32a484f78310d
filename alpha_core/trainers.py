"""The three kinds of trainer, as objects: everything that differs between the flagship's trainer, the supervised
bar members' and the RL agents' (the command, the summary file, the gate, what a checkpoint trades, what a search
scores, the entry point a Dagster step calls), in one place rather than compared as strings where it is used.
Data only: listing them imports no torch."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Trainer:
    name: str  # perception | supervised | rl: what summaries, `alpha models` and the bench tables call it
    command: str  # the CLI command that trains it
    summary_file: str  # a fold's summary, in its checkpoint folder
    gate_metric: str  # the validation gate's metric (docs/models.md, "Metric names")
    gate_label: str  # the same, in words
    reads_book: bool  # its inputs include the MBP-10 book (the flagship)
    trades_actions: bool  # a checkpoint trades its greedy actions (RL), not up-probabilities through a policy
    search_objective: str | None  # what a hyperopt trial of it scores, higher is better (None: not searched here)
    search_metric: str | None  # the same, in words
    entry: tuple[str, str]  # (module, function or class) that trains one fold: the Dagster step's code reference
    config: str  # its settings' class in alpha_core.train.configs (what finally checks a step's settings)

    def gated_value(self, summary: Mapping[str, Any]) -> tuple[float, float | None]:
        """(the gated metric, the final training loss) of a fold's summary (its JSON): an RL agent's validation
        Sharpe; a supervised or book model's mean validation AUC at the epoch of the checkpoint it kept."""
        if self.trades_actions:
            return float(summary["val_sharpe"]), None
        aucs = self.val_aucs(summary)
        return (sum(aucs) / len(aucs) if aucs else math.nan), float(summary["final_train_loss"])

    def val_aucs(self, summary: Mapping[str, Any]) -> list[float]:
        """The validation AUC per horizon at the kept checkpoint's epoch (none for an RL agent, which has no
        horizons)."""
        return [] if self.trades_actions else list(summary["val_auc"])

    def weights_file(self, summary: Mapping[str, Any]) -> str:
        """The file of the weights evaluation loads: the flagship names its kept checkpoint in its summary."""
        return summary["checkpoint"] if self.reads_book else "model.safetensors"


PERCEPTION = Trainer(
    name="perception",
    command="train",
    summary_file="alpha_train_summary.json",
    gate_metric="mean_val_auc",
    gate_label="mean validation AUC",
    reads_book=True,
    trades_actions=False,
    search_objective=None,  # tuned through `alpha train`'s flags
    search_metric=None,
    entry=("alpha_core.train.perception", "PerceptionTrainer"),
    config="TrainConfig",
)
SUPERVISED = Trainer(
    name="supervised",
    command="train-supervised",
    summary_file="summary.json",
    gate_metric="mean_val_auc",
    gate_label="mean validation AUC",
    reads_book=False,
    trades_actions=False,
    search_objective="val_mean_auc",
    search_metric="validation mean AUC",
    entry=("alpha_core.train.supervised", "train_supervised"),
    config="SupervisedTrainConfig",
)
RL = Trainer(
    name="rl",
    command="train-rl",
    summary_file="summary.json",
    gate_metric="val_sharpe",
    gate_label="validation Sharpe",
    reads_book=False,
    trades_actions=True,
    search_objective="val_sharpe",
    search_metric="validation Sharpe",
    entry=("alpha_core.train.rl", "train_rl"),
    config="RLTrainConfig",
)
TRAINERS = {t.name: t for t in (PERCEPTION, SUPERVISED, RL)}
