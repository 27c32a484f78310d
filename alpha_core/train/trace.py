"""`--kernel-step-trace`: one JSON line per training step, without a host sync on every step.

Each step's numbers are concatenated into one small device tensor; rows are copied to the host in one
transfer every `FLUSH_EVERY` steps (and at the end of each epoch), then written as JSON lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from alpha_core.atomic import check_writable

FLUSH_EVERY = 256
PER_HORIZON = ("bce", "smooth", "aux_huber", "aux_acc", "lambda", "bce_ema", "aux_huber_ema", "aux_acc_ema")


class StepTrace:
    def __init__(self, path: Path) -> None:
        check_writable(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fh = path.open("a")
        self.rows: list[torch.Tensor] = []
        self.meta: list[tuple[int, int, dict[str, float]]] = []

    def record(
        self,
        epoch: int,
        step: int,
        lrs: dict[str, float],
        loss: torch.Tensor,
        parts: dict[str, torch.Tensor],
        grad_norm: torch.Tensor,
        model,
    ) -> None:
        row = torch.cat(
            [
                loss.float().reshape(1),
                parts["bce"],
                parts["smooth"],
                parts["aux_huber"],
                parts["aux_acc"],
                model.lambdas,
                model.bce_ema,
                model.aux_huber_ema,
                model.aux_acc_ema,
                model.aux_lifted.float().reshape(1),
                model.buckets_tied().float().reshape(1),
                grad_norm.float().reshape(1),
            ]
        )
        self.rows.append(row)
        self.meta.append((epoch, step, lrs))
        if len(self.rows) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        check_writable(self.path)  # a writer that lost its attempt's lock stops here (alpha_core.atomic.guard)
        values = torch.stack(self.rows).cpu().tolist()
        for (epoch, step, lrs), row in zip(self.meta, values, strict=True):
            n_h = (len(row) - 4) // len(PER_HORIZON)
            record = {"epoch": epoch, "step": step, "lr": lrs, "loss": row[0]}
            for i, name in enumerate(PER_HORIZON):
                record[name] = row[1 + i * n_h : 1 + (i + 1) * n_h]
            record["aux_stop_grad_lifted"] = bool(row[-3])
            record["buckets_tied"] = bool(row[-2])
            record["grad_norm"] = row[-1]
            self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()
        self.rows.clear()
        self.meta.clear()
