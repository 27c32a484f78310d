"""Progress with an ETA for the long loops (predecoded files, training epochs and steps, hyperopt trials,
evaluated checkpoints), and the per-epoch curves of a training run.

Bars go to stderr, and only when stderr is a terminal and `alpha --quiet` was not given; the lines the loops
print on stdout (one per epoch or hyperopt trial) stay on stdout, written around the bars. tqdm and the event
writer are imported on first use: `alpha --help` imports this module and should not pay for them.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm import tqdm

    from alpha_core.tb_events import EventWriter

_quiet = False


def set_quiet(quiet: bool) -> None:
    global _quiet
    _quiet = quiet


def enabled() -> bool:
    return not _quiet and sys.stderr.isatty()


def bar(iterable: Iterable | None = None, *, total: int | None = None, desc: str, unit: str) -> tqdm:
    """A tqdm bar on stderr, cleared when done (disabled, and then free, when progress is off)."""
    from tqdm import tqdm

    return tqdm(
        iterable, total=total, desc=desc, unit=unit, file=sys.stderr, disable=not enabled(), leave=False, dynamic_ncols=True
    )


def say(line: str) -> None:
    """Print a line on stdout without tearing a bar on the terminal."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


class TrainingReporter:
    """What a trainer calls: `step()` per optimiser step (or `step(n)` per n environment steps), `epoch(...)`
    per epoch with its metrics and `say(line)` for its stdout line.

    It drives an epoch bar (the last validation metrics in its postfix) and a step bar, appends each epoch's
    metrics to `epoch_metrics` (the trainer's list, which its summary stores, so a resume continues it) and
    writes them to a TensorBoard event file in `out_dir`, opened at the first epoch. Each row also has `epoch_s`,
    the epoch's wall seconds (the first includes any compilation), so a projection can tell fixed from per-epoch cost.
    """

    say = staticmethod(say)

    def __init__(
        self, out_dir: Path, desc: str, epochs: int, steps_per_epoch: int | None = None, epoch_metrics: list[dict] | None = None
    ) -> None:
        self.out_dir = out_dir
        self.epoch_metrics = [] if epoch_metrics is None else epoch_metrics
        self.epochs = bar(total=epochs, desc=desc, unit="epoch")
        self.epochs.update(len(self.epoch_metrics))
        self.steps = bar(total=steps_per_epoch, desc="steps", unit="step")
        self.events: EventWriter | None = None
        self.epoch_started = time.perf_counter()

    def step(self, n: int = 1) -> bool:
        """Count `n` steps; True ("keep going"), so it also serves as a stable-baselines3 callback."""
        self.steps.update(n)
        return True

    def epoch(self, epoch: int, **metrics: float) -> None:
        now = time.perf_counter()
        metrics["epoch_s"], self.epoch_started = now - self.epoch_started, now
        self.epoch_metrics.append({"epoch": epoch, **metrics})
        if self.events is None:
            from alpha_core.tb_events import EventWriter

            self.events = EventWriter(self.out_dir)
        self.events.add_scalars(epoch, {k: v for k, v in metrics.items() if math.isfinite(v)})
        self.epochs.set_postfix({k: f"{v:.3f}" for k, v in metrics.items() if k.startswith("val")}, refresh=False)
        self.epochs.update(1)
        self.steps.reset()

    def close(self) -> None:
        self.steps.close()
        self.epochs.close()
        if self.events is not None:
            self.events.close()

    def __enter__(self) -> TrainingReporter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def horizon_metrics(prefix: str, horizons: Iterable[int], values: Iterable[float]) -> dict[str, float]:
    """`{prefix}_h{horizon}` per horizon (`val_auc_h10`, ...): flat keys that plot as curves."""
    return {f"{prefix}_h{h}": float(v) for h, v in zip(horizons, values, strict=True)}


def params_text(params: Mapping[str, object]) -> str:
    """`d_model=32 lr=0.00123 n_heads=2`: hyperparameters as a person reads them (floats to 3 significant digits;
    the results file keeps them whole)."""
    return " ".join(f"{k}={format(v, '.3g') if isinstance(v, float) else v}" for k, v in params.items())
