"""Learning-rate schedule of the original system: linear warm-up from 0, then cosine decay to lr_max * lr_min_factor."""

from __future__ import annotations

import math


def lr_at(lr_max: float, lr_min: float, step: int, warmup_steps: int, total_steps: int) -> float:
    """LR for the 0-indexed global training step `step` (the original system's `lr_schedule`, verbatim)."""
    if step < warmup_steps:
        return lr_max * (step + 1) / warmup_steps
    if total_steps <= warmup_steps:
        return lr_max
    progress = min(max((step - warmup_steps) / (total_steps - warmup_steps), 0.0), 1.0)
    return lr_min + (lr_max - lr_min) * 0.5 * (1.0 + math.cos(math.pi * progress))
