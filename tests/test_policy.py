"""The decision layer: the fixed rule kept as it was, bets averaged over their horizon, sized from the probability,
and a policy chosen on validation data that keeps an edge the fixed rule pays away in cost."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from alpha_core import metrics
from alpha_core.eval import policy

NS_DAY = 86_400 * 1_000_000_000


def positions_from_probs(probs: np.ndarray, band: float) -> np.ndarray:
    """The fixed rule on one horizon's probabilities (`policy.fixed`)."""
    return np.where(probs > 0.5 + band, 1.0, np.where(probs < 0.5 - band, -1.0, 0.0))


def net_sharpe(
    rule: policy.Policy, probs: np.ndarray, ts: np.ndarray, moves: np.ndarray, cost_ticks: float, aux: np.ndarray | None = None
) -> float:
    """The evaluator's annualised Sharpe (daily sessions, net of `cost_ticks` per unit of turnover) of a policy."""
    pnl = metrics.bar_pnl(policy.positions(rule, probs, aux), moves, cost_ticks)
    return metrics.sharpe(metrics.daily_pnl(ts, pnl)[1])


def test_the_fixed_policy_is_the_old_rule_to_the_bit():
    p = np.random.default_rng(0).random((5_000, 3)).astype(np.float32)
    p[::7, 1] = np.nan  # no prediction: flat
    p[:50, 1] = np.float32(0.55)  # at the band's edge
    got = policy.positions(policy.fixed(1, 0.05), p)
    np.testing.assert_array_equal(got, positions_from_probs(np.nan_to_num(p[:, 1], nan=0.5), 0.05))


def test_a_held_bet_is_averaged_over_its_horizon_and_sized_from_its_probability():
    p = np.full((8, 1), 0.5)
    p[2, 0] = 0.8  # one strong bar
    sized = policy.Policy(name="fitted", horizon=0, threshold=0.1, hold=3, sizing="bet")
    size = 2 * norm.cdf(0.3 / np.sqrt(0.8 * 0.2)) - 1  # AFML ch. 10: z = (p - 1/2) / sqrt(p (1 - p))
    np.testing.assert_allclose(policy.positions(sized, p), [0, 0, size / 3, size / 3, size / 3, 0, 0, 0])
    signed = sized.model_copy(update={"sizing": "sign"})
    np.testing.assert_allclose(policy.positions(signed, p), [0, 0, 1 / 3, 1 / 3, 1 / 3, 0, 0, 0])
    # a position averages bars i - 2 .. i, so it was decided when the latest of them was
    decision = np.array([-1, 10, 20, 30, 40, 50, 60, 70])
    np.testing.assert_array_equal(policy.decision_times(signed, decision), [-1, 10, 20, 30, 40, 50, 60, 70])
    late = np.array([5, 99, 1, 2, 3, 4, 0, 0])
    np.testing.assert_array_equal(policy.decision_times(signed, late), [5, 99, 99, 99, 3, 4, 4, 4])


def _market(seed: int, days: int = 120, bars: int = 300):
    """A persistent latent drift worth less than the cost per bar but more over its horizon, and its exact P(up)."""
    rng = np.random.default_rng(seed)
    n = days * bars
    z = np.zeros(n)
    eps = rng.standard_normal(n)
    for i in range(1, n):
        z[i] = 0.95 * z[i - 1] + np.sqrt(1 - 0.95**2) * eps[i]
    drift = 0.15 * z
    moves = drift + rng.standard_normal(n) * 2.0
    p1 = norm.cdf(drift / 2.0)
    p20 = norm.cdf(drift * (1 - 0.95**20) / 0.05 / (2.0 * np.sqrt(20)))  # the next 20 bars' drift
    ts = np.repeat(np.arange(days), bars) * NS_DAY + np.tile(np.arange(bars), days) * 60_000_000_000 + 14 * 3_600 * 10**9
    return ts, np.stack([p1, p20], axis=1), moves


def test_the_fitted_policy_keeps_an_edge_the_fixed_rule_pays_away():
    """Chosen on validation days only, the policy (horizon, threshold, hold, sizing) stays profitable on the test
    days at 1 tick, where the fixed rule (one bar at the shortest horizon) loses to the cost."""
    ts, p, moves = _market(3)
    half = len(ts) // 2
    chosen, val_sharpe, n = policy.fit(p[:half], ts[:half], moves[:half], 1.0, [1, 20])
    assert n == policy.grid_size(2) == 32 and chosen.name == "fitted" and val_sharpe > 0
    assert chosen.hold > 1  # the bet is held over its horizon

    def test_sharpe(rule: policy.Policy) -> float:
        return net_sharpe(rule, p[half:], ts[half:], moves[half:], 1.0)

    assert test_sharpe(policy.fixed(0, 0.05)) < 0 < test_sharpe(chosen)
    # the choice reads the validation rows only: other test rows, the same policy
    other = p.copy()
    other[half:] = np.random.default_rng(9).random(other[half:].shape)
    assert policy.fit(other[:half], ts[:half], moves[:half], 1.0, [1, 20])[0] == chosen


def test_the_fit_is_the_grids_best_and_counts_every_policy():
    ts, p, moves = _market(4, days=40)
    chosen, best, n = policy.fit(p, ts, moves, 1.0, [1, 20])
    sharpes = [net_sharpe(q, p, ts, moves, 1.0) for q in policy.grid(p, [1, 20])]
    assert len(sharpes) == n and best == max(sharpes) and chosen == policy.grid(p, [1, 20])[int(np.argmax(sharpes))]
    assert metrics.sharpe(metrics.daily_pnl(ts, metrics.bar_pnl(policy.positions(chosen, p), moves, 1.0))[1]) == best


def test_a_policy_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="extra"):
        policy.Policy(name="fitted", horizon=0, threshold=0.1, hold=1, band=0.1)
    with pytest.raises(ValueError, match="hold"):
        policy.Policy(name="fitted", horizon=0, threshold=0.1, hold=0)


def test_the_aux_rule_trades_only_an_expected_outcome_net_of_cost_above_zero():
    """The flagship's aux heads give each horizon's expected long and short outcome, net of cost: long when the long
    one is positive and the larger, short in the converse case, flat when neither pays."""
    aux = np.array([[2.0, 0.5, -1.0, 0.1], [-0.5, 0.0, 1.5, 0.2], [-0.2, 0.0, -0.1, 0.0], [1.0, 0.0, 3.0, 0.0]])
    rule = policy.Policy(name="fitted", horizon=0, threshold=0.0, hold=1, rule="aux")
    np.testing.assert_array_equal(policy.positions(rule, np.full((4, 2), 0.5), aux), [1.0, -1.0, 0.0, -1.0])
    with pytest.raises(ValueError, match="needs the aux heads"):
        policy.positions(rule, np.full((4, 2), 0.5))
    assert len(policy.grid(np.full((4, 2), 0.6), [1, 20], aux=True)) == policy.grid_size(2, aux=True) == 36
