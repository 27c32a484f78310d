"""Best-checkpoint tracking and early stopping, shared by every trainer (the original system's three independent trackers,
and the validation Sharpe of the RL trainer): one rule, `should_stop`.

"auc_h1000" is the original system's name for the longest horizon's AUC: 1000 snapshots for the book, 60 minutes for bars.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict

EARLY_STOP_METRICS = ("val_loss", "mean_auc", "auc_h1000", "none")


class Trackers(BaseModel):
    """Best-so-far per metric and the epochs without improvement; part of the resumable state."""

    model_config = ConfigDict(extra="forbid")

    best_val_loss: float = math.inf
    best_epoch: int = 0
    best_val_auc: list[float] = []
    best_mean_auc: float = -math.inf
    best_mean_auc_epoch: int = 0
    best_mean_auc_per_horizon: list[float] = []
    best_auc_h1000: float = -math.inf
    best_auc_h1000_epoch: int = 0
    best_auc_h1000_per_horizon: list[float] = []
    best_h1000_ckpt_path: str | None = None
    best_val_sharpe: float = -math.inf  # RL: the evaluator's daily-session Sharpe on the validation files
    best_val_sharpe_epoch: int = 0
    no_improvement: dict[str, int] = {"val_loss": 0, "mean_auc": 0, "auc_h1000": 0}
    epochs_completed: int = 0
    early_stopped: bool = False
    final_val_loss: float = 0.0
    final_val_auc: list[float] = []
    n_val_seqs_consumed: int = 0
    train_loss_sum: float = 0.0
    train_steps: int = 0
    train_seqs: int = 0
    global_step: int = 0
    epoch_metrics: list[dict[str, int | float]] = []  # the reporter's per-epoch rows, kept across a resume
    wall_time_s: float = 0.0

    def update(self, epoch: int, val_loss: float, aucs: list[float]) -> dict[str, bool]:
        """Record one validation; return which metrics improved (each tracked independently, as in the original system)."""
        mean_auc, long_auc = float(np.mean(aucs)), aucs[-1]
        improved = {
            "val_loss": val_loss < self.best_val_loss,
            "mean_auc": mean_auc > self.best_mean_auc,
            "auc_h1000": long_auc > self.best_auc_h1000,
        }
        if improved["val_loss"]:
            self.best_val_loss, self.best_epoch, self.best_val_auc = val_loss, epoch, aucs
        if improved["mean_auc"]:
            self.best_mean_auc, self.best_mean_auc_epoch, self.best_mean_auc_per_horizon = mean_auc, epoch, aucs
        if improved["auc_h1000"]:
            self.best_auc_h1000, self.best_auc_h1000_epoch, self.best_auc_h1000_per_horizon = long_auc, epoch, aucs
        for metric, better in improved.items():
            self.no_improvement[metric] = 0 if better else self.no_improvement[metric] + 1
        return improved

    def update_sharpe(self, epoch: int, sharpe: float) -> bool:
        """Record one validation Sharpe (higher is better; NaN never improves); return whether it improved."""
        improved = sharpe > self.best_val_sharpe
        if improved:
            self.best_val_sharpe, self.best_val_sharpe_epoch = sharpe, epoch
        self.no_improvement["val_sharpe"] = 0 if improved else self.no_improvement.get("val_sharpe", 0) + 1
        self.epochs_completed = epoch + 1
        return improved

    def should_stop(self, metric: str, patience: int) -> bool:
        """`patience` validations in a row without improving `metric` (0 or "none": never)."""
        return patience > 0 and metric != "none" and self.no_improvement.get(metric, 0) >= patience
