"""Backtest metrics: pure, vectorised numpy functions over per-bar positions, returns and PnL.

Conventions shared by every function (each docstring adds its own edge cases):

* A backtest gives, per bar t (OHLCV-1m, UTC ns timestamps, in time order), a position ``position[t]``
  (nominally in [-1, 1]; other values are accepted and scale linearly) held over the *next* bar, the
  return of that next bar ``next_return[t]`` (price units or ticks: all PnL is in the same units) and
  a cost per unit of turnover.
* The position before the first bar is 0 (flat): entering the first position is a trade and pays cost.
  The final position is not closed at the end (no exit cost is charged for it).
* Inputs must be 1-D, of equal length and finite; anything else raises ``ValueError`` (a NaN return
  is a data problem upstream, not something a metric should silently absorb).
* Empty inputs are valid: sums are 0, rates and ratios are 0.0, PSR/DSR are NaN.
* Daily figures are per CME session (17:00 to 16:00 America/Chicago; session date =
  (ts in Chicago + 7 h).date(), see `alpha_core.data.front_month.session_days`). A bar's PnL belongs
  to the session of the bar whose position earns it. Sessions with no bar at all are absent (not 0).
* Sharpe ratios in `probabilistic_sharpe_ratio` / `deflated_sharpe_ratio` are *non-annualised*
  (per period of the given returns); `sharpe` and `summarize()["sharpe"]` are annualised.
* Results may be ``inf`` (profit factor) or ``nan`` (PSR/DSR when undefined): `finite_or_none` /
  `json_safe` map them to ``None`` for JSON reports.
* One cost setting everywhere (evaluation, RL rewards, RL validation, hyperopt): `DEFAULT_COST_TICKS`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from alpha_core.sessions import session_days

EULER_GAMMA = 0.5772156649015329  # Euler-Mascheroni constant (np.euler_gamma)
PSR_MIN_RETURNS = 3  # fewer returns than this: PSR/DSR are NaN
DEFAULT_COST_TICKS = 1.0  # ticks per unit of position change (a 2-tick round trip); the project's one cost setting
COST_SENSITIVITY_TICKS = (0.0, 0.5, 1.0, 2.0)  # costs every report row also shows the Sharpe at
BOOTSTRAP_RESAMPLES = 2_000
BOOTSTRAP_SEED = 0  # fixed: the same series always gets the same interval


# ----------------------------------------------------------------------------------------------- helpers


def _vec(name: str, x: Any, dtype: type = np.float64) -> np.ndarray:
    a = np.asarray(x, dtype=dtype)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise ValueError(f"{name} has non-finite values")
    return a


def _same_len(**arrays: np.ndarray) -> None:
    lens = {k: len(v) for k, v in arrays.items()}
    if len(set(lens.values())) > 1:
        raise ValueError(f"length mismatch: {lens}")


def _deltas(position: np.ndarray) -> np.ndarray:
    """|position_t - position_{t-1}| with position_{-1} = 0."""
    return np.abs(np.diff(position, prepend=0.0))


def finite_or_none(x: float | int | None) -> float | None:
    """``float(x)`` when finite, else ``None`` (NaN, +inf, -inf and None): strict JSON has no NaN/Infinity.

    In a metrics report, ``None`` means "undefined" (PSR/DSR) or "infinite" (profit factor with no
    losing bar); the key tells which.
    """
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def json_safe(summary: dict[str, Any]) -> dict[str, Any]:
    """A copy of a `summarize` result fit for ``json.dumps(..., allow_nan=False)``.

    ints (and bools) are kept, other numbers go through `finite_or_none`, anything else is kept as is.
    """
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if isinstance(v, bool | int | np.integer):
            out[k] = v if isinstance(v, bool) else int(v)
        elif isinstance(v, float | np.floating):
            out[k] = finite_or_none(v)
        else:
            out[k] = v
    return out


# ----------------------------------------------------------------------------------------------- PnL


def bar_pnl(position: Any, next_return: Any, cost_per_unit: Any) -> np.ndarray:
    """PnL of each bar: ``position_t * next_return_t - cost_per_unit * |position_t - position_{t-1}|``.

    ``position_{-1} = 0``, so the first bar pays for entering its position. ``cost_per_unit`` is a
    scalar or a per-bar array (same length; the cost of the turnover made at bar t), non-negative.
    Returns a float64 array of the inputs' length (empty for empty inputs).
    """
    pos = _vec("position", position)
    ret = _vec("next_return", next_return)
    _same_len(position=pos, next_return=ret)
    cost = np.asarray(cost_per_unit, dtype=np.float64)
    if cost.ndim > 1 or (cost.ndim == 1 and len(cost) != len(pos)):
        raise ValueError(f"cost_per_unit must be a scalar or have the positions' length, got shape {cost.shape}")
    if not np.isfinite(cost).all() or (cost < 0).any():
        raise ValueError("cost_per_unit must be finite and >= 0")
    return pos * ret - cost * _deltas(pos)


def daily_pnl(ts_ns: Any, pnl: Any) -> tuple[np.ndarray, np.ndarray]:
    """Sum of bar PnL per CME session.

    ``ts_ns``: UTC ns timestamps (int64 or datetime64[ns]) of the bars, in any order. Returns
    ``(sessions, pnl_per_session)``: the distinct session dates as int32 days since 1970-01-01,
    ascending, and the float64 sum of ``pnl`` over each. A session is present iff at least one bar
    falls in it (a session of flat bars gives 0.0; a session without bars is absent). Empty inputs
    give two empty arrays.
    """
    ts = np.asarray(ts_ns)
    if ts.ndim != 1:
        raise ValueError(f"ts_ns must be 1-D, got shape {ts.shape}")
    if ts.dtype.kind == "M":
        ts = ts.astype("datetime64[ns]")
    ts = ts.astype(np.int64)
    p = _vec("pnl", pnl)
    _same_len(ts_ns=ts, pnl=p)
    if len(ts) == 0:
        return np.empty(0, dtype=np.int32), np.empty(0, dtype=np.float64)
    days, inverse = np.unique(session_days(ts), return_inverse=True)
    return days.astype(np.int32), np.bincount(inverse, weights=p, minlength=len(days)).astype(np.float64)


# ----------------------------------------------------------------------------------------------- ratios


def _zero_variance(x: np.ndarray) -> bool:
    """All values identical (exact test: a float mean of equal values can leave a tiny non-zero std)."""
    return len(x) == 0 or float(np.ptp(x)) == 0.0


def sharpe(daily: Any, periods_per_year: float = 252) -> float:
    """Annualised Sharpe ratio ``mean / std(ddof=1) * sqrt(periods_per_year)`` of per-period (daily) PnL.

    No risk-free rate is subtracted (PnL of a futures position). Returns 0.0 when there are fewer
    than 2 periods or when the variance is zero (all values identical, whatever their sign): the
    ratio is then undefined and 0.0 is the "no evidence of skill" value.
    """
    d = _vec("daily", daily)
    if not (periods_per_year > 0):
        raise ValueError("periods_per_year must be > 0")
    if len(d) < 2 or _zero_variance(d):
        return 0.0
    return float(d.mean() / d.std(ddof=1) * math.sqrt(periods_per_year))


def sharpe_standard_error(daily: Any, periods_per_year: float = 252) -> float:
    """Standard error of the annualised `sharpe` for non-iid returns (Mertens 2002).

    ``Var(SR) = (1 + SR^2 / 2 - g3 SR + (g4 - 3) / 4 SR^2) / T`` with SR the per-period Sharpe (ddof=1),
    g3 / g4 the skewness and non-excess kurtosis (biased moments, as in the PSR) and T the number of
    periods; the result is annualised like the Sharpe (x sqrt(periods_per_year)). The variance is never
    negative (g4 >= 1 + g3^2 makes it >= (1 - g3 SR / 2)^2 / T). NaN where the moments are undefined
    (fewer than 3 periods, or zero variance).
    """
    d = _vec("daily", daily)
    m = _sharpe_moments(d)
    if m is None:
        return math.nan
    sr, g3, g4 = m
    var = (1.0 + sr * sr / 2.0 - g3 * sr + (g4 - 3.0) / 4.0 * sr * sr) / len(d)
    return float(math.sqrt(max(var, 0.0)) * math.sqrt(periods_per_year))


def bootstrap_sharpe_interval(
    daily: Any,
    periods_per_year: float = 252,
    level: float = 0.95,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile interval of the annualised `sharpe` over day-block bootstrap resamples.

    Each resample draws T whole sessions with replacement (a session's PnL keeps its intraday dependence);
    each resample's Sharpe follows `sharpe` (0.0 for zero variance). Fixed seed: reproducible. (NaN, NaN)
    with fewer than 2 sessions.
    """
    d = _vec("daily", daily)
    if len(d) < 2:
        return math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, len(d), size=(n_resamples, len(d)))
    samples = d[idx]
    std = samples.std(axis=1, ddof=1)
    flat = np.ptp(samples, axis=1) == 0.0
    ratio = np.where(flat, 0.0, samples.mean(axis=1) / np.where(flat, 1.0, std)) * math.sqrt(periods_per_year)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(ratio, [tail, 1.0 - tail])
    return float(low), float(high)


def max_drawdown(pnl: Any) -> float:
    """Largest peak-to-trough fall of the cumulative PnL, as a positive number in PnL units.

    The curve starts at 0 (before the first bar), so an initial loss is a drawdown from that 0 peak.
    0.0 for a never-falling curve and for empty input.
    """
    p = _vec("pnl", pnl)
    curve = np.concatenate(([0.0], np.cumsum(p)))
    return float(np.max(np.maximum.accumulate(curve) - curve))


def drawdown(equity: Any) -> np.ndarray:
    """How far each point of an equity curve sits below its running peak (<= 0). The curve starts at 0 before its
    first point, as in `max_drawdown`: a first losing session is a drawdown already."""
    eq = _vec("equity", equity)
    return eq - np.maximum.accumulate(np.r_[0.0, eq])[1:] if len(eq) else eq


def win_rate(pnl: Any, position: Any) -> float:
    """Share of bars with a non-zero position whose PnL is strictly positive.

    Flat bars (position 0) are ignored even if they carry a cost; a PnL of exactly 0 is not a win.
    0.0 when no bar has a position (including empty input).
    """
    p = _vec("pnl", pnl)
    pos = _vec("position", position)
    _same_len(pnl=p, position=pos)
    held = pos != 0
    n = int(held.sum())
    return float((p[held] > 0).sum() / n) if n else 0.0


def profit_factor(pnl: Any) -> float:
    """Gross profit / gross loss over bars: ``sum(pnl[pnl > 0]) / -sum(pnl[pnl < 0])``.

    * profits and no losing bar: ``inf`` (use `finite_or_none` for JSON);
    * losing bars and no winning bar: 0.0;
    * no non-zero bar at all (all flat, or empty input): 0.0.
    """
    p = _vec("pnl", pnl)
    gross_profit = float(p[p > 0].sum())
    gross_loss = float(-p[p < 0].sum())
    if gross_loss == 0.0:
        return math.inf if gross_profit > 0 else 0.0
    return gross_profit / gross_loss


def turnover(position: Any) -> float:
    """Mean ``|position_t - position_{t-1}|`` per bar (``position_{-1} = 0``); 0.0 for empty input.

    A reversal from +1 to -1 is a turnover of 2 on that bar.
    """
    pos = _vec("position", position)
    return float(_deltas(pos).mean()) if len(pos) else 0.0


def n_trades(position: Any) -> int:
    """Number of bars where the position differs from the previous bar's (``position_{-1} = 0``).

    Entering the first position counts; a reversal (+1 -> -1) is one trade; 0 for all-flat or empty input.
    """
    pos = _vec("position", position)
    return int(np.count_nonzero(_deltas(pos)))


def hit_rate(position: Any, next_return: Any) -> float:
    """Share of bars with a non-zero position where ``sign(position) == sign(next_return)``.

    A zero next return is a miss (its sign matches neither side). Costs play no part. 0.0 when no bar
    has a position (including empty input).
    """
    pos = _vec("position", position)
    ret = _vec("next_return", next_return)
    _same_len(position=pos, next_return=ret)
    held = pos != 0
    n = int(held.sum())
    return float((np.sign(pos[held]) == np.sign(ret[held])).sum() / n) if n else 0.0


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank (scipy.stats.rankdata's default, without importing scipy)."""
    order = np.argsort(x, kind="mergesort")
    first_of_run = np.r_[True, x[order][1:] != x[order][:-1]]
    run_of = np.empty(len(x), dtype=np.int64)
    run_of[order] = np.cumsum(first_of_run) - 1
    bounds = np.r_[np.flatnonzero(first_of_run), len(x)]  # run r spans sorted positions bounds[r]..bounds[r+1]-1
    return 0.5 * (bounds[run_of] + bounds[run_of + 1] + 1)


def auc(probs: Any, labels: Any) -> float | np.ndarray:
    """ROC AUC per horizon, ignoring rows whose label is NaN.

    ``probs`` and ``labels`` have the same shape, ``(n,)`` (one horizon: returns a float) or ``(n, H)``
    (returns a float64 array of H values). Labels are 0/1 or NaN; any other label, or a NaN score on
    a labelled row, raises ``ValueError``. Tied scores count 1/2 (Mann-Whitney). A horizon with only
    one class (or no labelled row) gives 0.5.
    """
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if p.shape != y.shape or p.ndim not in (1, 2):
        raise ValueError(f"probs and labels must share a 1-D or 2-D shape, got {p.shape} and {y.shape}")
    one = p.ndim == 1
    p2, y2 = (p[:, None], y[:, None]) if one else (p, y)
    out = np.full(p2.shape[1], 0.5)
    for j in range(p2.shape[1]):
        ok = ~np.isnan(y2[:, j])
        yj, pj = y2[ok, j], p2[ok, j]
        if not np.isin(yj, (0.0, 1.0)).all():
            raise ValueError(f"labels of horizon {j} must be 0, 1 or NaN")
        if not np.isfinite(pj).all():
            raise ValueError(f"probs of horizon {j} are not finite where the label is set")
        n1 = int(yj.sum())
        n0 = len(yj) - n1
        if n1 and n0:
            r1 = average_ranks(pj)[yj == 1.0].sum()
            out[j] = (r1 - n1 * (n1 + 1) / 2) / (n1 * n0)
    return float(out[0]) if one else out


# ----------------------------------------------------------------------------------------------- PSR / DSR


def _sharpe_moments(returns: np.ndarray) -> tuple[float, float, float] | None:
    """(non-annualised SR with ddof=1, skewness, non-excess kurtosis), moments biased; None if undefined."""
    if len(returns) < PSR_MIN_RETURNS or _zero_variance(returns):
        return None
    dev = returns - returns.mean()
    m2 = float(np.mean(dev**2))
    g3 = float(np.mean(dev**3)) / m2**1.5
    g4 = float(np.mean(dev**4)) / m2**2
    return float(returns.mean() / returns.std(ddof=1)), g3, g4


def _psr(sr: float, g3: float, g4: float, n: int, benchmark: float) -> float:
    # 1 - g3 SR + (g4 - 1)/4 SR^2 >= 0 because g4 >= 1 + g3^2 (zero only for two-valued samples at SR = 2/g3).
    denom = max(1.0 - g3 * sr + (g4 - 1.0) / 4.0 * sr * sr, 0.0)
    num = (sr - benchmark) * math.sqrt(n - 1)
    if denom == 0.0:
        return 0.5 if num == 0 else (1.0 if num > 0 else 0.0)
    from scipy.stats import norm  # here: importing scipy.stats costs a training pod a second at start

    return float(norm.cdf(num / math.sqrt(denom)))


def probabilistic_sharpe_ratio(returns: Any, benchmark_sharpe: float = 0.0) -> float:
    """Probabilistic Sharpe Ratio (Bailey & López de Prado, 2012): P[true SR > benchmark_sharpe].

    ``PSR = Phi((SR - SR*) sqrt(n - 1) / sqrt(1 - g3 SR + (g4 - 1) / 4 SR^2))`` where n = len(returns),
    SR = mean / std(ddof=1) of ``returns`` (non-annualised: per period of the returns, as must be
    ``benchmark_sharpe``), g3 the skewness and g4 the (non-excess, normal = 3) kurtosis, both with
    the biased (population) moment estimators (``scipy.stats.skew`` / ``kurtosis(fisher=False)``).

    * PSR = 0.5 exactly when SR = SR*; it decreases with SR*, and increases with n (SR fixed) and
      with SR as long as g3 * SR < 2 (beyond that the skew term makes it fall: a property of the formula);
    * fewer than 3 returns, or zero variance (all returns identical): NaN (the statistic is
      undefined; 0.5 would read as "SR equals the benchmark"). `finite_or_none` maps it to None;
    * a degenerate zero denominator (two-valued returns with SR = 2 / g3): 1.0, 0.0 or 0.5 by the sign
      of SR - SR*.
    """
    r = _vec("returns", returns)
    m = _sharpe_moments(r)
    if m is None:
        return math.nan
    return _psr(*m, len(r), float(benchmark_sharpe))


def expected_max_sharpe(n_trials: int, trials_sharpe_var: float) -> float:
    """SR* of the DSR: ``sqrt(V) ((1 - g) Phi^-1(1 - 1/N) + g Phi^-1(1 - 1/(N e)))``, g = Euler-Mascheroni.

    The expected maximum of N independent non-annualised Sharpe estimates of zero-skill strategies
    whose Sharpe estimates have variance V. N = 1 gives 0.0 (no selection: the formula's
    Phi^-1(0) = -inf term is defined away).
    """
    if isinstance(n_trials, bool) or int(n_trials) != n_trials or n_trials < 1:
        raise ValueError(f"n_trials must be an integer >= 1, got {n_trials!r}")
    if not (math.isfinite(trials_sharpe_var) and trials_sharpe_var >= 0):
        raise ValueError(f"trials_sharpe_var must be finite and >= 0, got {trials_sharpe_var!r}")
    n = int(n_trials)
    if n == 1:
        return 0.0
    from scipy.stats import norm

    z = (1 - EULER_GAMMA) * norm.ppf(1 - 1 / n) + EULER_GAMMA * norm.ppf(1 - 1 / (n * math.e))
    return float(math.sqrt(trials_sharpe_var) * z)


DISPERSION_LEVEL = 0.05  # the trials' spread counts only where it is significant at this level (Cochran's Q)


def trials_sharpe_dispersion(
    annual_sharpes: Any, sessions: Any, periods_per_year: float = 252, level: float = DISPERSION_LEVEL
) -> float | None:
    """The variance of the hyperopt trials' TRUE per-session Sharpe, counted only where the trials differ by more
    than their sampling noise, as a random-effects meta-analysis of the trials' Sharpes.

    Each trial's per-session Sharpe s_i (annualised / sqrt(periods_per_year)) has the sampling variance
    ``v_i = (1 + s_i^2 / 2) / T_i`` (Lo 2002, normal returns) times the small-sample factor of a t statistic,
    ``(T_i - 1) / (T_i - 3)`` (2x at T = 5). Cochran's ``Q = sum w_i (s_i - s_w)^2`` (w_i = 1 / v_i, s_w their
    weighted mean) is chi-square with n - 1 degrees of freedom when the trials share one true Sharpe. Only where Q
    exceeds its (1 - level) quantile is a dispersion counted, the DerSimonian-Laird estimate
    ``(Q - (n - 1)) / (sum w - sum w^2 / sum w)``; otherwise 0.

    Why the test: with a few trials, their sample variance minus the noise is itself mostly noise (with 2 trials on a
    5-session validation file V came out 24x the null at its 90th percentile, an expected maximum Sharpe of ~30), and
    the DSR took that noise for a search that found real differences. With no real difference between the trials,
    V now exceeds the null in at most `level` of searches, so its 90th percentile is the null at 2-20 trials
    (docs/validity.md, tests/test_eval_metrics.py). Trials of 3 sessions or fewer carry no estimate (infinite
    variance) and are left out; None when fewer than 2 remain."""
    from scipy.stats import chi2

    s = np.asarray(annual_sharpes, dtype=np.float64) / math.sqrt(periods_per_year)
    t = np.asarray(sessions, dtype=np.float64)
    if s.shape != t.shape:
        raise ValueError(f"one session count per trial: {s.shape} Sharpes, {t.shape} counts")
    ok = np.isfinite(s) & (t > 3)
    s, t = s[ok], t[ok]
    if len(s) < 2:
        return None
    w = 1.0 / ((1.0 + s * s / 2.0) / t * (t - 1) / (t - 3))
    centre = float((w * s).sum() / w.sum())
    q = float((w * (s - centre) ** 2).sum())
    if not q > chi2.ppf(1.0 - level, len(s) - 1):
        return 0.0
    return max((q - (len(s) - 1)) / float(w.sum() - (w * w).sum() / w.sum()), 0.0)


def deflated_sharpe_ratio(returns: Any, n_trials: int, trials_sharpe_var: float | None = None) -> float:
    """Deflated Sharpe Ratio (Bailey & López de Prado, 2014): the PSR against ``expected_max_sharpe``.

    ``n_trials`` (N >= 1) is the number of strategies/configurations tried before picking this one;
    ``trials_sharpe_var`` is the variance across those trials of their non-annualised Sharpe estimates
    (same periodicity as ``returns``). When it is unknown (None) the variance of a Sharpe estimate
    under the null (true SR = 0, normal returns) is used: ``1 / (n - 1)`` with n = len(returns).

    * N = 1 (or V = 0): SR* = 0 and DSR = PSR(SR* = 0);
    * N > 1 and V > 0: SR* > 0, so DSR < PSR (for a defined PSR strictly between 0 and 1);
    * same NaN cases as `probabilistic_sharpe_ratio` (fewer than 3 returns, zero variance).
    """
    r = _vec("returns", returns)
    m = _sharpe_moments(r)
    var = 1.0 / (len(r) - 1) if (trials_sharpe_var is None and len(r) >= 2) else trials_sharpe_var
    sr_star = expected_max_sharpe(n_trials, 0.0 if var is None else float(var))  # validates even when m is None
    if m is None:
        return math.nan
    return _psr(*m, len(r), sr_star)


# ----------------------------------------------------------------------------------------------- summary


def _backtest(ts_ns: Any, position: Any, next_return: Any, cost_per_unit: Any) -> tuple[np.ndarray, ...]:
    """The checked timestamps and positions, the bar PnL and the daily session PnL of one backtest."""
    ts = np.asarray(ts_ns)
    if ts.dtype.kind == "M":
        ts = ts.astype("datetime64[ns]")
    ts = _vec("ts_ns", ts.astype(np.int64), dtype=np.int64)
    pos = _vec("position", position)
    _same_len(ts_ns=ts, position=pos)
    if len(ts) > 1 and not (np.diff(ts) > 0).all():
        raise ValueError("ts_ns must be strictly increasing")
    pnl = bar_pnl(pos, next_return, cost_per_unit)
    _, daily = daily_pnl(ts, pnl)
    return ts, pos, pnl, daily


def headline(
    ts_ns: Any, position: Any, next_return: Any, cost_per_unit: Any = DEFAULT_COST_TICKS, periods_per_year: float = 252
) -> dict[str, Any]:
    """`summarize`'s ``n_bars``, ``n_sessions``, ``total_pnl``, ``sharpe`` and ``turnover``, the same numbers, without
    the rest: for the callers that read only these (a checkpoint's validation score, the RL agents' validation every
    epoch), which would otherwise pay the bootstrap's 2,000 resamples, the cost sensitivity and, once a process,
    importing scipy.stats for the PSR (1-1.7 s of a training pod, bench/README.md)."""
    _, pos, pnl, daily = _backtest(ts_ns, position, next_return, cost_per_unit)
    return {
        "n_bars": len(pnl),
        "n_sessions": len(daily),
        "total_pnl": float(pnl.sum()),
        "sharpe": sharpe(daily, periods_per_year),
        "turnover": turnover(pos),
    }


def summarize(
    ts_ns: Any,
    position: Any,
    next_return: Any,
    cost_per_unit: Any = DEFAULT_COST_TICKS,
    n_trials: int = 1,
    trials_dispersion: float | None = None,
    periods_per_year: float = 252,
) -> dict[str, Any]:
    """Every metric of one backtest, as plain Python numbers.

    ``ts_ns`` must be strictly increasing (the order defines position_{t-1}). Daily figures use CME
    session PnL; PSR and DSR are computed on the daily session PnL (non-annualised Sharpe). Keys:

    ``n_bars``, ``n_sessions`` (sessions with at least one bar), ``total_pnl``, ``sharpe`` (annualised),
    ``sharpe_se`` (`sharpe_standard_error`), ``sharpe_ci_low`` / ``sharpe_ci_high`` (day-block bootstrap 95%),
    ``sharpe_by_cost`` (the Sharpe at each of `COST_SENSITIVITY_TICKS`, keyed ``f"{cost:g}"``),
    ``max_drawdown`` (over bar PnL), ``win_rate``, ``profit_factor`` (over bar PnL; may be inf),
    ``turnover``, ``n_trades``, ``hit_rate``, ``psr``, ``dsr`` (may be NaN), ``dsr_null`` (the DSR at the
    null variance), ``dsr_n_trials`` and ``dsr_variance`` (the N and V the DSR used; V is NaN when undefined).

    The DSR's V is the variance of N zero-skill Sharpe estimates of this test's length: the null variance
    ``1 / (T - 1)`` plus ``trials_dispersion``, the variance of the trials' true Sharpe
    (`trials_sharpe_dispersion`; None or 0: the null variance alone, and then ``dsr == dsr_null``).
    Pass the result through `json_safe` before writing JSON.
    """
    ts, pos, pnl, daily = _backtest(ts_ns, position, next_return, cost_per_unit)
    ci_low, ci_high = bootstrap_sharpe_interval(daily, periods_per_year)
    by_cost = {
        f"{c:g}": sharpe(daily_pnl(ts, bar_pnl(pos, next_return, c))[1], periods_per_year) for c in COST_SENSITIVITY_TICKS
    }
    null = 1.0 / (len(daily) - 1) if len(daily) >= 2 else math.nan
    variance = null + (trials_dispersion or 0.0)
    return {
        "n_bars": len(pnl),
        "n_sessions": len(daily),
        "total_pnl": float(pnl.sum()),
        "sharpe": sharpe(daily, periods_per_year),
        "sharpe_se": sharpe_standard_error(daily, periods_per_year),
        "sharpe_ci_low": ci_low,
        "sharpe_ci_high": ci_high,
        "sharpe_by_cost": by_cost,
        "max_drawdown": max_drawdown(pnl),
        "win_rate": win_rate(pnl, pos),
        "profit_factor": profit_factor(pnl),
        "turnover": turnover(pos),
        "n_trades": n_trades(pos),
        "hit_rate": hit_rate(pos, next_return),
        "psr": probabilistic_sharpe_ratio(daily),
        "dsr": deflated_sharpe_ratio(daily, n_trials, None if math.isnan(variance) else variance),
        "dsr_null": deflated_sharpe_ratio(daily, n_trials),
        "dsr_n_trials": int(n_trials),
        "dsr_variance": float(variance),
    }


# ----------------------------------------------------------------------------------------------- PBO

PBO_BLOCKS = 16  # CSCV splits the sessions into this many blocks (fewer for a shorter file: an even count >= 2)


def probability_of_backtest_overfitting(daily: Any, n_blocks: int = PBO_BLOCKS) -> float | None:
    """PBO by combinatorially symmetric cross-validation (Bailey, Borwein, López de Prado and Zhu, 2015).

    ``daily`` is [configurations, sessions]: each configuration's daily PnL on the same sessions. The sessions are
    cut into S contiguous blocks (S even, at most `n_blocks` and the number of sessions); for each of the C(S, S/2)
    halves taken as in-sample, the configuration of the best in-sample Sharpe is ranked among all by its Sharpe on
    the other half: omega = rank / (N + 1), lambda = log(omega / (1 - omega)). PBO is the share of splits with
    lambda <= 0, the chance that the in-sample winner is at or below the median out of sample. None with fewer than 2
    configurations or 2 sessions."""
    from itertools import combinations

    m = np.asarray(daily, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] < 2 or m.shape[1] < 2:
        return None
    s = min(n_blocks, m.shape[1]) // 2 * 2
    blocks = np.array_split(np.arange(m.shape[1]), s)
    # per block: each configuration's sum and sum of squares, so every split's Sharpes are two matrix products
    total = np.stack([m[:, b].sum(axis=1) for b in blocks], axis=1)  # [N, S]
    square = np.stack([(m[:, b] ** 2).sum(axis=1) for b in blocks], axis=1)
    count = np.array([len(b) for b in blocks], dtype=np.float64)
    ins = np.zeros((math.comb(s, s // 2), s))
    for row, chosen in enumerate(combinations(range(s), s // 2)):
        ins[row, list(chosen)] = 1.0

    def sharpe_of(sel: np.ndarray) -> np.ndarray:  # [splits, N]
        n = sel @ count
        mean = (sel @ total.T) / n[:, None]
        var = ((sel @ square.T) - n[:, None] * mean**2) / np.maximum(n - 1, 1)[:, None]
        sd = np.sqrt(np.maximum(var, 0.0))
        return np.where(sd > 1e-12 * (np.abs(mean) + 1), mean / np.where(sd > 0, sd, 1.0), 0.0)

    sr_in, sr_out = sharpe_of(ins), sharpe_of(1.0 - ins)
    best = sr_out[np.arange(len(ins)), np.argmax(sr_in, axis=1)][:, None]
    rank = (sr_out < best).sum(axis=1) + ((sr_out == best).sum(axis=1) + 1) / 2.0  # 1 = worst out of sample, ties share
    omega = rank / (sr_out.shape[1] + 1)
    logits = np.log(omega / (1.0 - omega))
    return float(np.mean(logits <= 0.0))


# ----------------------------------------------------------------------------------------------- cost models

IMPACT_TICKS_PER_UNIT = 0.5  # linear impact: each unit traded moves the price this many ticks against the trade


def cost_per_unit(model: str, position: Any, cost_ticks: float, half_spread: Any = None) -> np.ndarray | float:
    """Ticks charged per unit of position change at each bar under a named cost model (issue 31 item 2):

    * ``flat``: `cost_ticks` (the report's cost);
    * ``half_spread``: half the bid-ask spread at each decision, from the MBP-10 book (`half_spread`, NaN where the
      book has no snapshot: there the flat cost);
    * ``impact``: the flat cost plus a linear price impact, IMPACT_TICKS_PER_UNIT x the units traded, so a change of
      |d| units costs cost_ticks |d| + 0.5 d^2."""
    if model == "flat":
        return cost_ticks
    if model == "half_spread":
        spread = np.asarray(half_spread, dtype=np.float64)
        return np.where(np.isfinite(spread), spread, cost_ticks)
    if model == "impact":
        return cost_ticks + IMPACT_TICKS_PER_UNIT * _deltas(_vec("position", position))
    raise ValueError(f"unknown cost model {model!r} (flat, half_spread, impact)")
