"""Losses and metrics shared by the trainers: masked BCE at every labelled position, AUC per horizon."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score


def masked_bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean BCE over every position and horizon whose label is finite (NaN = past the file's end)."""
    mask = torch.isfinite(labels)
    target = torch.where(mask, labels, torch.zeros_like(labels))
    loss = F.binary_cross_entropy_with_logits(logits.float(), target, reduction="none")
    return (loss * mask).sum() / mask.sum().clamp_min(1)


def auc_per_horizon(probs: np.ndarray, labels: np.ndarray) -> list[float]:
    """AUC per horizon over finite labels; 0.5 when a horizon has one class only (the spec's default)."""
    out = []
    for j in range(labels.shape[1]):
        ok = np.isfinite(labels[:, j])
        y = labels[ok, j]
        out.append(float(roc_auc_score(y, probs[ok, j])) if len(np.unique(y)) == 2 else 0.5)
    return out
