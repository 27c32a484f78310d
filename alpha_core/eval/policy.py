"""The decision layer: how a checkpoint's up-probabilities become positions, chosen on its validation file only.

A policy reads one horizon's probability p per bar. A bar bets when |p - 0.5| clears the entry threshold: a unit
bet in p's direction (`sign`), or sized from p as in López de Prado, *Advances in Financial Machine Learning*, ch. 10
(`bet`: z = (p - 0.5) / sqrt(p (1 - p)), size = 2 Phi(z) - 1). Each bet lasts `hold` bars, the horizon it was
predicted for, and the position is the average of the bets still active (AFML 10.4, "averaging active bets"): a
signal that persists keeps the position instead of paying the cost again, and a lone flicker moves it by 1/hold.

- `aux` rule (the flagship, whose aux heads predict the long and the short outcome of each horizon in ticks, net of
  the labels' cost): long when the expected long outcome is positive and above the short one, short in the converse
  case, else flat; a unit bet held one bar or the horizon. The fit compares these beside the probability policies.
- `fixed`: the old rule, kept for comparison: +1 above 0.5 + band, -1 below 0.5 - band, held one bar.
- `fitted` (the default): chosen among `grid()` by net Sharpe at the report's cost on the checkpoint's VALIDATION
  predictions (`fit`), then applied unchanged to its test file. Every policy the fit compares counts in the DSR's N.

A position at bar i averages the bets of bars i - hold + 1 .. i, so its decision time is the latest data any of
those bars read (`decision_times`): each was decided at or before its own entry, hence before bar i's.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from alpha_core import metrics

POLICIES = ("fitted", "fixed")  # EvalConfig.policy and `alpha evaluate --policy`; the first is the default
# the share of validation bars whose |p - 0.5| clears the entry threshold: every bar, the strongest half, fifth, 5%
TRADE_SHARES = (1.0, 0.5, 0.2, 0.05)
SIZINGS = ("sign", "bet")
HOLDS = ("bar", "horizon")  # a bet lasts one bar, or its horizon's length in bars
GRID_VERSION = 1  # bump when the grid changes: a recorded fit of another grid is not reused
NO_DECISION = -1


class Policy(BaseModel):
    """How one checkpoint trades its probabilities (stored with its evaluation record and in the report)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: Literal["fixed", "fitted"]
    horizon: int = Field(ge=0)  # index into the horizons
    threshold: float = Field(ge=0, lt=0.5)  # bet only when |p - 0.5| > threshold
    hold: int = Field(ge=1)  # bars each bet lasts; the position averages the active bets
    sizing: Literal["sign", "bet"] = "sign"
    share: float | None = None  # fitted: the share of validation bars the threshold lets trade
    rule: Literal["probability", "aux"] = "probability"  # aux: the flagship's expected outcomes net of cost

    @property
    def needs_aux(self) -> bool:
        return self.rule == "aux"

    def describe(self) -> str:
        if self.rule == "aux":
            return f"{self.name}: h{self.horizon} aux outcome net of cost > 0, hold {self.hold}"
        return f"{self.name}: h{self.horizon} |p-0.5|>{self.threshold:.4g} hold {self.hold} {self.sizing}"


def fixed(horizon: int, band: float) -> Policy:
    return Policy(name="fixed", horizon=horizon, threshold=band, hold=1, sizing="sign")


def bets(policy: Policy, probs: np.ndarray, aux: np.ndarray | None = None) -> np.ndarray:
    """[N] the bet each bar makes from its probabilities [N, H] (NaN: no prediction, no bet), or for an `aux` policy
    from the expected outcomes [N, 2H] (long per horizon, then short)."""
    if policy.rule == "aux":
        if aux is None:
            raise ValueError(f"{policy.describe()} needs the aux heads' outcomes")
        h = policy.horizon
        long = np.nan_to_num(np.asarray(aux, dtype=np.float64)[:, h], nan=0.0)
        short = np.nan_to_num(np.asarray(aux, dtype=np.float64)[:, aux.shape[1] // 2 + h], nan=0.0)
        return np.where((long > 0) & (long >= short), 1.0, np.where((short > 0) & (short > long), -1.0, 0.0))
    p = np.nan_to_num(np.asarray(probs)[:, policy.horizon], nan=0.5)  # in its own dtype, as the fixed rule compared
    t = policy.threshold
    direction = np.where(p > 0.5 + t, 1.0, np.where(p < 0.5 - t, -1.0, 0.0))
    if policy.sizing == "sign":
        return direction
    from scipy.special import ndtr  # here: `alpha evaluate --help` reads this module's Policy without scipy

    q = np.clip(p.astype(np.float64), 1e-9, 1.0 - 1e-9)
    return np.abs(2.0 * ndtr((q - 0.5) / np.sqrt(q * (1.0 - q))) - 1.0) * direction


def _trailing(values: np.ndarray, hold: int, reduce) -> np.ndarray:
    out = values.copy()
    for k in range(1, min(hold, len(values))):
        out[k:] = reduce(out[k:], values[:-k])
    return out


def positions(policy: Policy, probs: np.ndarray, aux: np.ndarray | None = None) -> np.ndarray:
    """[N] float64 positions: the mean of the bets of the last `hold` bars (the first bars average fewer)."""
    b = bets(policy, probs, aux)
    if policy.hold == 1:
        return b
    total = _trailing(b, policy.hold, np.add)
    return total / policy.hold


def decision_times(policy: Policy, decision: np.ndarray) -> np.ndarray:
    """[N] the latest data each position depends on: the max decision time of the bars whose bets it averages."""
    decision = np.asarray(decision, dtype=np.int64)
    return decision if policy.hold == 1 else _trailing(decision, policy.hold, np.maximum)


def grid(probs: np.ndarray, hold_bars: list[int], aux: bool = False) -> list[Policy]:
    """The policies `fit` compares on validation probabilities [N, H]: per horizon, held one bar or its own length
    in bars (`hold_bars`), per trade share (the threshold is that quantile of the validation |p - 0.5|) and per
    sizing: `grid_size(H)` of them; with `aux`, the aux rule per horizon and hold besides."""
    out = []
    for h, length in enumerate(hold_bars):
        if aux:
            for hold in (1, max(1, int(length))):
                out.append(Policy(name="fitted", horizon=h, threshold=0.0, hold=hold, rule="aux"))
        edge = np.abs(np.asarray(probs, dtype=np.float64)[:, h] - 0.5)
        edge = edge[np.isfinite(edge)]
        for hold in (1, max(1, int(length))):
            for share in TRADE_SHARES:
                threshold = 0.0 if share >= 1.0 or not len(edge) else float(np.quantile(edge, 1.0 - share))
                for sizing in SIZINGS:
                    out.append(
                        Policy(
                            name="fitted",
                            horizon=h,
                            threshold=min(threshold, 0.4999),
                            hold=hold,
                            sizing=sizing,
                            share=share,
                        )
                    )
    return out


def grid_size(n_horizons: int, aux: bool = False) -> int:
    """Policies a fit compares (each counts in the DSR's N), whether or not a horizon's two holds coincide."""
    return n_horizons * len(HOLDS) * (len(TRADE_SHARES) * len(SIZINGS) + (1 if aux else 0))


def fit(
    probs: np.ndarray,
    ts: np.ndarray,
    moves: np.ndarray,
    cost_ticks: float,
    hold_bars: list[int],
    aux: np.ndarray | None = None,
) -> tuple[Policy, float, int]:
    """(the grid's policy of the highest net Sharpe on these validation bars, that Sharpe, the policies compared).
    Ties keep the first in grid order (shortest horizon, aux before probabilities, most trades, sign sizing), so a
    fit is reproducible. `aux` (the flagship's expected outcomes [N, 2H]) adds the aux rule to the grid."""
    best, sharpe, n, _ = fit_with_pbo(probs, ts, moves, cost_ticks, hold_bars, aux, with_pbo=False)
    return best, sharpe, n


def fit_with_pbo(
    probs: np.ndarray,
    ts: np.ndarray,
    moves: np.ndarray,
    cost_ticks: float,
    hold_bars: list[int],
    aux: np.ndarray | None = None,
    with_pbo: bool = True,
) -> tuple[Policy, float, int, float | None]:
    """`fit`, and the probability that choosing among the grid on these sessions overfits
    (`metrics.probability_of_backtest_overfitting` over the grid's daily net PnL: the chance the winner on half the
    sessions is at or below the median on the other half)."""
    candidates = grid(probs, hold_bars, aux is not None)
    best, best_sharpe, daily = candidates[0], -math.inf, []
    for policy in candidates:
        d = metrics.daily_pnl(ts, metrics.bar_pnl(positions(policy, probs, aux), moves, cost_ticks))[1]
        daily.append(d)
        s = metrics.sharpe(d)
        if s > best_sharpe:
            best, best_sharpe = policy, s
    overfit = metrics.probability_of_backtest_overfitting(np.stack(daily)) if with_pbo else None
    return best, best_sharpe, len(candidates), overfit


def hold_bars(horizons: list[int], unit: str, book_rows: int | None = None, bar_rows: int | None = None) -> list[int]:
    """Each horizon's length in bars: minutes for bar horizons; book horizons (snapshots) at the file's mean
    snapshots per bar."""
    if unit == "snapshots":
        per_bar = max(1.0, (book_rows or 1) / max(bar_rows or 1, 1))
        return [max(1, round(h / per_bar)) for h in horizons]
    return [max(1, int(h)) for h in horizons]
