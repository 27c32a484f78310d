"""What a model of alpha must provide, and the optional hooks it may add: one place to read the model protocol.

A bar model (`BarModel`, every supervised member) maps a window of normalised bars x [B, K, F] to causal
per-horizon logits [B, K, H]: the logit at position k depends on x[:, :k+1] only. The flagship (`BookModel`) reads
the book with its time steps and is trained and predicted by its own paths. The hooks below are optional; the
trainers and the predictor ask `isinstance(model, Hook)` and fall back to the plain forward when a model lacks one.
Each hook exists for speed or for a model whose forward is not a deterministic function of x; none may change what
the plain path would compute (tests/test_last_position.py, tests/test_evaluate.py check that to the bit).
Each model file names the hooks it implements in its `Hooks:` line at the top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: this module imports no torch
    import torch
    from torch import Tensor

    from alpha_core.data.loader import WindowBatch


class BarModel(Protocol):
    """Required of every supervised bar member: x [B, K, F] -> logits [B, K, H], causal per position."""

    def __call__(self, x: Tensor) -> Tensor: ...


class BookModel(Protocol):
    """The flagship: x [B, K, F] and time steps dt [B, K] -> {"logits": [B, K, H], aux outcomes, ...}; the
    predictor reads only the last position (`last_logits` [B, H], `last_aux` [B, 2H])."""

    def __call__(self, x: Tensor, dt: Tensor) -> dict[str, Tensor]: ...

    def last_logits(self, x: Tensor, dt: Tensor) -> Tensor: ...

    def last_aux(self, x: Tensor, dt: Tensor) -> Tensor: ...


@runtime_checkable
class OwnLoss(Protocol):
    """Trains on its own objective instead of the masked BCE of its logits (the diffusion member: a DDPM's
    epsilon MSE over the forward moves, which needs the batch's outcomes, not only its labels)."""

    def loss(self, batch: WindowBatch, tick_size: float) -> Tensor: ...


@runtime_checkable
class Sampling(Protocol):
    """A forward that draws noise (the diffusion member): validation and prediction score the last position only,
    on a seeded generator, so reruns agree and the cost is 1/K of the whole forward."""

    def forward_last(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor: ...  # [B, K, F] -> [B, H]


@runtime_checkable
class LastPosition(Protocol):
    """Only what the window's last position depends on, equal to `forward(x)[:, -1]`: prediction scores one
    position per window, and a model whose last output needs less than the whole window computes only that."""

    def last_position(self, x: Tensor) -> Tensor: ...  # [B, K, F] -> [B, H] (or from `position_wise`'s output)


@runtime_checkable
class PositionWise(Protocol):
    """A part that reads each position alone (the TFT's variable selection, TGGN's graph steps): prediction runs it
    once per bar, not once in each of the K windows holding that bar, then `forward_windows` (or `last_position`)
    on the windows of its output. `forward(x) == forward_windows(position_wise(x))`."""

    def position_wise(self, x: Tensor) -> Tensor: ...  # [B, K, F] -> [B, K, ...]

    def forward_windows(self, h: Tensor) -> Tensor: ...  # [B, K, ...] -> [B, K, H]


@runtime_checkable
class CpuBatch(Protocol):
    """Its own number of windows per forward in CPU evaluation (measured fastest for it, bench/README.md), instead
    of the predictor's CPU_BATCH."""

    cpu_batch: int


def cpu_batch(model: object, default: int) -> int:
    """The model's own CPU batch (`CpuBatch`), else `default`."""
    return model.cpu_batch if isinstance(model, CpuBatch) else default
