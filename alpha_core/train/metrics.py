"""Losses and metrics shared by the trainers: masked BCE at every labelled position, AUC per horizon."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from alpha_core import metrics


def masked_bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean BCE over every position and horizon whose label is finite (NaN = past the file's end)."""
    mask = torch.isfinite(labels)
    target = torch.where(mask, labels, torch.zeros_like(labels))
    loss = F.binary_cross_entropy_with_logits(logits.float(), target, reduction="none")
    return (loss * mask).sum() / mask.sum().clamp_min(1)


def auc_per_horizon(probs: np.ndarray, labels: np.ndarray) -> list[float]:
    """AUC per horizon over finite labels; 0.5 when a horizon has one class only (the original system's default).

    The evaluator's implementation (`alpha_core.metrics.auc`), so validation and test AUC are one metric."""
    return np.atleast_1d(metrics.auc(probs, labels)).tolist()
