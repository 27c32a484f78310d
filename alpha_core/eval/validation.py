"""A checkpoint's validation score: the evaluator's Sharpe of its positions on its validation file, computed once.

The validation-weighted ensemble weights each member by this number. The process that makes a checkpoint computes
it as soon as the weights are written (`alpha train-supervised`, its hyperopt trials, `alpha train-rl`), with the
evaluator's own functions (`predict`, the decision clock, `file_score`) at the evaluator's default horizon, band and
cost, and records it in the summary (`val_score`). `alpha evaluate`, from every door, reads it where the record is
for the same file and settings (`recorded_sharpe`) and predicts the validation file itself only where it is not
(another `--band`, `--horizon` or `--cost-ticks`, or a checkpoint without a record, e.g. the flagship, whose
trainer reads no bars). So evaluation costs the test files, and a report's weight is the checkpoint's own number:
made on a GPU, it comes from GPU predictions, which a CPU rerun could differ from in a position at the band's edge.

The same pass fits the checkpoint's decision policy (`policy.fit`: the grid's best net Sharpe at the evaluator's
default cost on these validation probabilities) and records it beside the score (`policy`, `policy_sharpe`,
`n_policies`, `policy_grid`), so every door applies the policy its trainer fitted, unchanged, to the test file;
`fit_policy` is the one function both the trainer and `alpha evaluate` (for a checkpoint without the record, or at
another cost) call.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from alpha_core import metrics
from alpha_core.data.sidecar import HORIZON_UNIT, Sidecar
from alpha_core.eval import policy as policies
from alpha_core.eval.configs import DEFAULT_BAND, DEFAULT_HORIZON
from alpha_core.eval.policy import Policy
from alpha_core.eval.predict import Checkpoint, Loaded, Prediction, check_decision_clock, entry_ts, predict


class ValidationScore(BaseModel):
    """The evaluator's Sharpe of a checkpoint's positions on one validation file, with what it depends on."""

    model_config = ConfigDict(extra="forbid")

    file: str
    sharpe: float
    sessions: int
    horizon: int | None  # the horizon index and band positions follow; None for RL agents (their actions)
    band: float | None
    cost_ticks: float
    device: str  # where its predictions were made
    # the decision policy fitted on this file (None: an RL agent, or a record older than the decision layer)
    policy: Policy | None = None
    policy_sharpe: float | None = None  # its net Sharpe on this file at `cost_ticks`
    n_policies: int | None = None  # the policies the fit compared (each counts in the DSR's N)
    policy_grid: int | None = None  # policy.GRID_VERSION of the grid it was chosen from
    policy_pbo: float | None = None  # PBO of the choice (CSCV over the grid x the file's sessions)


class PolicyFit(BaseModel):
    """A checkpoint's fitted policy, the validation Sharpe it made and how many policies were compared."""

    model_config = ConfigDict(extra="forbid")

    policy: Policy
    sharpe: float
    n_policies: int
    pbo: float | None = None  # the probability that choosing among the grid on this file overfits (CSCV)


def next_move_ticks(bars: Sidecar) -> np.ndarray:
    """Each bar's move to the next bar, in ticks (0 after the last)."""
    price = np.asarray(bars.price)
    return np.append(np.diff(price), 0.0) / bars.meta.tick_size


def file_score(bars: Sidecar, position: np.ndarray, cost_ticks: float = metrics.DEFAULT_COST_TICKS) -> tuple[float, int]:
    """The evaluator's Sharpe of positions on one bar file (annualised, daily sessions) and its sessions."""
    summary = metrics.headline(np.asarray(bars.ts), position, next_move_ticks(bars), cost_ticks)
    return summary["sharpe"], summary["n_sessions"]


def score(
    model: Loaded,
    bars: Sidecar,
    book: Sidecar | None = None,
    horizon: int = DEFAULT_HORIZON,
    band: float = DEFAULT_BAND,
    cost_ticks: float = metrics.DEFAULT_COST_TICKS,
    entry: np.ndarray | None = None,
) -> ValidationScore:
    """The checkpoint's positions on the validation file `bars`, checked against the decision clock, scored.
    `entry`: `entry_ts(bars, book)`, when the caller has it."""
    entry = entry_ts(bars, book) if entry is None else entry
    pred = predict(model, bars, book, horizon, band, scored=False, entry=entry)
    check_decision_clock(model.ckpt.model, bars.meta.source.name, np.asarray(bars.ts), pred.position, pred.decision_ts, entry)
    sharpe, sessions = file_score(bars, pred.position, cost_ticks)
    rl = model.ckpt.trainer.trades_actions
    fitted = None if rl else fit_from(model, pred, bars, book, cost_ticks)
    return ValidationScore(
        file=bars.meta.source.name,
        sharpe=sharpe,
        sessions=sessions,
        horizon=None if rl else horizon,
        band=None if rl else band,
        cost_ticks=cost_ticks,
        device=str(model.device),
        policy=None if fitted is None else fitted.policy,
        policy_sharpe=None if fitted is None else fitted.sharpe,
        n_policies=None if fitted is None else fitted.n_policies,
        policy_grid=None if fitted is None else policies.GRID_VERSION,
        policy_pbo=None if fitted is None else fitted.pbo,
    )


def hold_bars(model: Loaded, bars: Sidecar, book: Sidecar | None) -> list[int]:
    """Each of the model's horizons in bars of this file: minutes for bar models; a book model's snapshots at the
    file's snapshots a bar."""
    if model.ckpt.trainer.reads_book and book is not None:
        return policies.hold_bars(book.meta.horizons, HORIZON_UNIT[book.meta.kind], book.rows, bars.rows)
    return policies.hold_bars(bars.meta.horizons, HORIZON_UNIT[bars.meta.kind])


def fit_from(model: Loaded, pred: Prediction, bars: Sidecar, book: Sidecar | None, cost_ticks: float) -> PolicyFit:
    """The policy fitted on a validation prediction's per-bar probabilities (`policy.fit`)."""
    holds = hold_bars(model, bars, book)
    policy, sharpe, n, pbo = policies.fit_with_pbo(
        pred.bar_probs, np.asarray(bars.ts), next_move_ticks(bars), cost_ticks, holds, pred.bar_aux
    )
    return PolicyFit(policy=policy, sharpe=sharpe, n_policies=n, pbo=pbo)


def fit_policy(
    model: Loaded, bars: Sidecar, book: Sidecar | None, cost_ticks: float, entry: np.ndarray | None = None
) -> PolicyFit:
    """Predict the validation file `bars` and fit the checkpoint's policy on it (`alpha evaluate` where no
    recorded fit serves: `recorded_policy`)."""
    aux = model.ckpt.trainer.reads_book  # the flagship's aux heads: its aux rule is fitted beside the others
    pred = predict(model, bars, book, DEFAULT_HORIZON, DEFAULT_BAND, scored=False, entry=entry, with_aux=aux)
    return fit_from(model, pred, bars, book, cost_ticks)


def recorded_policy(ckpt: Checkpoint, val_name: str, cost_ticks: float) -> PolicyFit | None:
    """The policy the checkpoint's trainer fitted, where it was fitted on `val_name` at this cost from this grid."""
    try:
        s = ValidationScore.model_validate(ckpt.summary.get("val_score"))
    except ValidationError:
        return None
    if s.policy is None or s.file != val_name or s.cost_ticks != cost_ticks or s.policy_grid != policies.GRID_VERSION:
        return None
    return PolicyFit(policy=s.policy, sharpe=s.policy_sharpe, n_policies=s.n_policies, pbo=s.policy_pbo)


def recorded_sharpe(ckpt: Checkpoint, val_name: str, horizon: int, band: float, cost_ticks: float) -> float | None:
    """The summary's validation Sharpe where it is the number `score` gives on `val_name` at these settings, else
    None (then the evaluator predicts the file)."""
    try:
        s = ValidationScore.model_validate(ckpt.summary.get("val_score"))
    except ValidationError:  # none, or not a record this code reads
        return None
    if s.file != val_name or s.cost_ticks != cost_ticks:
        return None
    if s.horizon is not None and (s.horizon != horizon or s.band != band):
        return None
    return s.sharpe
