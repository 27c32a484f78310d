"""The ensemble report: its schema (pydantic, validated on write and read), Markdown tables and PNG plots.

Every row (each model and ensemble, out of sample and per fold) carries its uncertainty: the number of sessions, the
Sharpe's standard error (Mertens 2002), a day-block bootstrap 95% interval and the Sharpe at 0, 0.5, 1 and 2 ticks
of cost, beside the PSR and the DSR with the N (trials x configurations) and V it used (and how V was estimated),
and the DSR at the null variance. Each model row also compares its AUC with the demo oracle's on exactly the rows
and horizons it was scored on. Files written beside `ensemble_report.json`: `ensemble_report.md` and, per symbol,
`<symbol>_equity.png` (out-of-sample equity of every model and both ensembles, by session index),
`<symbol>_drawdown.png`, `<symbol>_equity_drawdown.png` (both, one above the other) and `<symbol>_fold_sharpe.png`.
Non-finite numbers are stored as null (an infinite profit factor, an undefined PSR).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import secrets
import textwrap
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from alpha_core.atomic import atomic_write_bytes, atomic_write_json, guard
from alpha_core.errors import DataError
from alpha_core.eval.export import tables
from alpha_core.eval.policy import Policy
from alpha_core.faults import crash_point
from alpha_core.locks import Lock
from alpha_core.metrics import drawdown


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Excluded(Strict):
    model: str
    symbol: str
    fold: int | None
    reason: str


class Metrics(Strict):
    """`alpha_core.metrics.summarize` of one backtest; None where a number is undefined or infinite."""

    n_bars: int
    n_sessions: int  # CME sessions with at least one bar: the sample size behind every daily statistic
    total_pnl: float  # ticks, net of cost
    sharpe: float  # annualised, daily session PnL
    sharpe_se: float | None  # Mertens (2002) standard error, annualised
    sharpe_ci_low: float | None  # day-block bootstrap 95% interval (2,000 resamples, fixed seed)
    sharpe_ci_high: float | None
    sharpe_by_cost: dict[str, float]  # ticks per unit of turnover -> Sharpe
    max_drawdown: float
    win_rate: float
    profit_factor: float | None  # None: no losing bar (infinite)
    turnover: float
    n_trades: int
    hit_rate: float
    psr: float | None
    dsr: float | None
    dsr_null: float | None  # the DSR with V = the null variance 1/(T-1) (no dispersion among the trials)
    dsr_n_trials: int  # N: hyperopt trials x configurations the report compares
    dsr_variance: float | None  # V: the variance of N zero-skill daily (non-annualised) Sharpe estimates

    @model_validator(mode="before")
    @classmethod
    def _finite(cls, values: dict) -> dict:
        if not isinstance(values, dict):
            return values
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}


class AucComparison(Strict):
    """A model's AUC and the oracle's on the same rows (`scored_on` sidecars, labels set, prediction made).

    Bar models are scored on every bar of their test files. The book model is scored on a fixed, seeded sample of
    each test file's snapshots: `sample` = 65,536 (`alpha_core.eval.predict.AUC_SAMPLE`) rows drawn uniformly
    without replacement (seed `AUC_SAMPLE_SEED`) from those with a full window, every such row when a file has
    fewer. `ci_low`/`ci_high` bound the AUC by DeLong et al. (1988): the variance from the structural components
    of the Mann-Whitney statistic, a normal 95% interval clipped to [0, 1], the scored rows taken as independent
    draws, so for a sample it says how far the AUC of every snapshot of the file may lie (it leaves out the
    dependence between neighbouring rows). With the sample's ~32k rows of each class it is about +-0.004 around an
    AUC of 0.6."""

    scored_on: Literal["bars", "book"]
    horizons: list[int]
    horizon_unit: str
    n_rows: list[int]  # rows scored per horizon
    model: list[float]
    ci_low: list[float] | None = None  # 95% DeLong interval of `model`, per horizon
    ci_high: list[float] | None = None
    sample: int | None = None  # rows drawn per test file (book); None: every row (bars)
    oracle: list[float] | None = None
    gap: list[float] | None = None  # oracle - model
    oracle_note: str | None = None  # why there is no oracle comparison


class FoldResult(Strict):
    fold: int
    test_file: str
    checkpoint: str | None = None  # the attempt folder the fold's weights were read from (None: an ensemble)
    metrics: Metrics
    auc: AucComparison | None = None
    weights: dict[str, float] | None = None  # ensembles: the weight of each model
    policy: Policy | None = None  # how the checkpoint's probabilities became positions (None: RL agent, ensemble)
    policy_val_sharpe: float | None = None  # the fitted policy's net Sharpe on the validation file it was chosen on
    oracle_sharpe: float | None = None  # the generator oracle's strategy on this test file (None: real data)
    policy_pbo: float | None = None  # probability that the policy choice overfit its validation file (CSCV, 2015)


class ModelResult(Strict):
    name: str
    oos: Metrics  # out of sample: every fold's test file, in time order
    folds: list[FoldResult]
    auc: AucComparison | None = None  # pooled over the folds' test files
    n_trials: int  # hyperopt trials behind this row (an ensemble: its members' together)
    n_configurations: int  # rows the report compares (models + ensembles) x the policies each fit compared
    n_policies: int = 1  # the policies each checkpoint's fit compared (1: the fixed rule)
    # params files behind this row without a search record: its N assumes evaluate.ASSUMED_SEARCH_TRIALS for each
    search_unknown: list[str] = []
    # out-of-sample Sharpe under each named cost model (metrics.cost_per_unit): flat (the report's cost), half_spread
    # (half the book's spread at each decision; None without a book), impact (flat + linear impact)
    sharpe_by_cost_model: dict[str, float | None] = {}
    half_spread_share: float = 0.0  # the share of bars costed from the book's spread (the rest at the flat cost)
    # the ceiling (generated data only; None: real data): the oracle's exact probabilities through the same policy
    # fitting on the same rows, its out-of-sample net Sharpe, and the row's Sharpe / it (skill capture; None when the
    # oracle's Sharpe is not positive)
    oracle_sharpe: float | None = None
    capture: float | None = None
    trials_dispersion: float | None  # variance of the trials' true per-session Sharpe (None: no trials)
    dsr_estimator: str  # how V was estimated, in words
    hyperopt_results: list[str] = []  # the results.json files of the searches behind this row
    equity_ts: list[int]  # downsampled cumulative PnL (ticks) for plots
    equity: list[float]


class SymbolReport(Strict):
    models: dict[str, ModelResult]
    ensembles: dict[str, ModelResult]


class EnsembleReport(Strict):
    created: str
    models_dir: str
    horizon_index: int
    band: float
    cost_ticks: float
    policy: Literal["fitted", "fixed"] = "fixed"  # EvalConfig.policy (reports before the decision layer: fixed)
    symbols: dict[str, SymbolReport]
    excluded: list[Excluded]
    run_id: str | None = None  # the pipeline run this report belongs to (None: a CLI evaluation of a folder)
    reused: dict[str, str] = {}  # "model fold k" -> the other run (and attempt) it was reused from, by name
    files: dict[str, str] = {}  # the Markdown and plots written with this report -> sha256


COLUMNS = ("max_drawdown", "win_rate", "profit_factor", "turnover", "n_trades", "hit_rate", "total_pnl")


def _fmt(value: float | int | None, none: str = "n/a") -> str:
    if value is None:
        return none
    return f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"


def _uncertainty(m: Metrics) -> list[str]:
    costs = " / ".join(_fmt(v) for v in m.sharpe_by_cost.values())
    return [
        str(m.n_sessions),
        _fmt(m.sharpe),
        _fmt(m.sharpe_se),
        f"[{_fmt(m.sharpe_ci_low)}, {_fmt(m.sharpe_ci_high)}]",
        costs,
        str(m.dsr_n_trials),
        _fmt(m.dsr_variance),
        _fmt(m.psr),
        _fmt(m.dsr),
        _fmt(m.dsr_null),
    ]


HEADLINE = ("model", "sessions", "Sharpe", "95% CI", "DSR", "max DD", "PnL")


def headline(sym: SymbolReport) -> str:
    """The numbers that decide, as a Markdown table: one row per model and ensemble (in bold), out of sample: the
    sessions behind the Sharpe, its 95% interval, the DSR, the maximum drawdown and the PnL (ticks, net of cost).
    Short enough to fit beside Dagster's sidebars at 1,600 px, and under 1,000 characters, which Dagster shows
    inline."""

    def num(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:,.{digits}f}"

    rows = [*sym.models.items(), *((f"**{k}**", v) for k, v in sym.ensembles.items())]
    lines = ["| " + " | ".join(HEADLINE) + " |", "|---|" + "---:|" * (len(HEADLINE) - 1)]
    for name, r in rows:
        m = r.oos
        lines.append(
            f"| {name} | {m.n_sessions} | {num(m.sharpe, 2)} | [{num(m.sharpe_ci_low, 2)},"
            f"{num(m.sharpe_ci_high, 2)}] | {num(m.dsr, 2)} | {num(m.max_drawdown, 0)} | {num(m.total_pnl, 0)} |"
        )
    return "\n".join(lines)


TRUSTED_DSR = 0.95


def verdict(sym: SymbolReport) -> str:
    """One line that decides: which rows, if any, show an edge once the search behind them is counted."""
    rows = {**sym.models, **sym.ensembles}
    trusted = [name for name, r in rows.items() if r.oos.dsr is not None and r.oos.dsr >= TRUSTED_DSR]
    if not rows:
        return "Verdict: no model could be evaluated."
    if not trusted:
        best = max(rows.items(), key=lambda kv: kv[1].oos.dsr if kv[1].oos.dsr is not None else -1.0)
        return (
            f"Verdict: no row reaches DSR {TRUSTED_DSR} (best: {best[0]}, DSR {_fmt(best[1].oos.dsr)}): "
            "no edge shown out of sample."
        )
    return f"Verdict: {', '.join(trusted)} reach DSR {TRUSTED_DSR} or more out of sample."


def excluded_by_model(excluded: list[Excluded]) -> list[str]:
    """Each model's folds left out, grouped by reason ("tft fold 0, 2: gate failed: ..."): the printed summary's
    lines and the report page's `left out`."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for e in excluded:
        grouped.setdefault((e.model, e.reason), []).extend([] if e.fold is None else [str(e.fold)])
    return [f"{model}{' fold ' + ', '.join(folds) if folds else ''}: {reason}" for (model, reason), folds in grouped.items()]


def excluded_in_brief(excluded: list[Excluded]) -> str:
    """Excluded in one line, for the first screen of the report's page (the table with every fold is further down)."""
    if not excluded:
        return "none: every checkpoint found was evaluated"
    return f"{len(excluded)} left out. " + "; ".join(excluded_by_model(excluded))


def test_folds(sym: SymbolReport) -> list[str]:
    """The test files the report's rows trade on, once each (a fold is its test file)."""
    return sorted({f.test_file for r in [*sym.models.values(), *sym.ensembles.values()] for f in r.folds})


READING = (
    "Sharpe: annualised, from each CME session's PnL net of cost. 95% CI: if it spans 0, the test sessions show "
    "no edge. DSR: the chance the true Sharpe is above 0 once the search behind the row is counted; trust a "
    "row at 0.95 or more. Excluded: checkpoints the report did not use, with the reason."
)


def summary(report: EnsembleReport, path: str | Path) -> str:
    """The report in plain text, read in ten seconds: per symbol the out-of-sample headline of every model and
    ensemble, what was excluded and why (a line per model and reason), and where the full report is. `alpha evaluate` and
    `alpha run` end with it, so every door shows the same answer."""

    def num(value: float | None, digits: int = 2) -> str:
        return "n/a" if value is None else f"{value:,.{digits}f}"

    lines = []
    for symbol, sym in report.symbols.items():
        rows = [*sym.models.items(), *sym.ensembles.items()]
        sessions = max((r.oos.n_sessions for _, r in rows), default=0)
        width = max((len(name) for name, _ in rows), default=5)
        lines += [
            f"{symbol}{f' (run {report.run_id})' if report.run_id else ''}: out of sample over "
            f"{len(test_folds(sym))} test fold(s), {sessions} test sessions, "
            f"{report.cost_ticks:g} tick(s) of cost per unit traded",
            f"  {'model':<{width}} {'Sharpe':>7}  {'95% CI':<17} {'DSR':>5} {'max DD':>8} {'PnL':>9}",
        ]
        for name, r in rows:
            m = r.oos
            ci = f"[{num(m.sharpe_ci_low)}, {num(m.sharpe_ci_high)}]"
            lines.append(
                f"  {name:<{width}} {num(m.sharpe):>7}  {ci:<17} {num(m.dsr):>5} {num(m.max_drawdown, 0):>8} "
                f"{num(m.total_pnl, 0):>9}"
            )
        if not rows:
            lines.append("  (no model could be evaluated)")
        lines.append(f"  {verdict(sym)}")
        lines += [f"  reused {what} from {source}" for what, source in report.reused.items()]
        lines += [f"  excluded {item}" for item in excluded_by_model([e for e in report.excluded if e.symbol == symbol])]
        lines.append("")
    where = Path(path)
    lines += [*textwrap.wrap(READING, 116), f"Full report: {where.with_suffix('.md')} (plots beside it)."]
    return "\n".join(lines)


def markdown(report: EnsembleReport) -> str:
    if report.policy == "fixed":
        rule = f"fixed policy: horizon index {report.horizon_index}, flat band ±{report.band}, held one bar"
    else:
        rule = "each checkpoint's policy fitted on its validation file (below, per fold)"
    lines = [
        f"# Ensemble report{f' of run {report.run_id}' if report.run_id else ''} ({report.created})",
        "",
        *(f"Reused by name: {what} from {source}." for what, source in report.reused.items()),
        "",
        f"Out-of-sample walk-forward backtests; PnL in ticks, {report.cost_ticks} tick(s) per unit of turnover, "
        f"{rule}. Sharpe: annualised, daily CME sessions; "
        f"SE: Mertens (2002); 95% CI: day-block bootstrap; N: hyperopt trials x configurations compared; "
        f"V: variance of N zero-skill daily Sharpe estimates, the null variance 1/(T-1) plus the dispersion of "
        f"the trials' true Sharpe (net of their sampling noise); dsr@null: the DSR at the null variance.",
        "",
    ]
    for symbol, sym in report.symbols.items():
        rows = [*sym.models.items(), *((f"**{k}**", v) for k, v in sym.ensembles.items())]
        costs = "Sharpe @ " + "/".join(next(iter(rows))[1].oos.sharpe_by_cost) + " ticks" if rows else "Sharpe @ cost"
        head = ["model", "sessions", "sharpe", "SE", "95% CI", costs, "N", "V", "psr", "dsr", "dsr@null"]
        lines += [
            f"## {symbol}",
            "",
            verdict(sym),
            "",
            headline(sym),
            "",
            "### All metrics",
            "",
            "| " + " | ".join([*head, *COLUMNS]) + " |",
            "|---|" + "---:|" * (len(head) - 1 + len(COLUMNS)),
        ]
        for name, result in rows:
            lines.append(
                f"| {name} | "
                + " | ".join(_uncertainty(result.oos) + [_fmt(getattr(result.oos, c), none="inf") for c in COLUMNS])
                + " |"
            )
        unknown = [(name, r) for name, r in rows if r.search_unknown]
        if unknown:
            lines += ["", "Search unknown (params without their search record; N at an assumed number of trials):"]
            lines += [f"- {name}: {r.dsr_estimator}" for name, r in unknown]
        lines += [
            "",
            "### Per fold",
            "",
            "| model | fold | test file | " + " | ".join(head[1:]) + " |",
            "|---|---:|---|" + "---:|" * (len(head) - 1),
        ]
        for name, result in rows:
            for f in result.folds:
                lines.append(f"| {name} | {f.fold} | {f.test_file} | " + " | ".join(_uncertainty(f.metrics)) + " |")
        lines += [
            "",
            "### Policies (chosen on each fold's validation file, applied unchanged to its test file)",
            "",
            "| model | fold | policy | validation Sharpe | policies compared | PBO |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for name, result in rows:
            for f in result.folds:
                what = f.policy.describe() if f.policy else ("its members' policies" if f.weights else "the agent's actions")
                lines.append(
                    f"| {name} | {f.fold} | {what} | {_fmt(f.policy_val_sharpe)} | {result.n_policies} | {_fmt(f.policy_pbo)} |"
                )
        lines += [
            "",
            "### Cost models (out of sample)",
            "",
            "| model | flat | half-spread (book) | bars costed from the book | flat + linear impact |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, result in rows:
            c = result.sharpe_by_cost_model
            lines.append(
                f"| {name} | {_fmt(c.get('flat'))} | {_fmt(c.get('half_spread'), none='n/a (no book)')} | "
                f"{result.half_spread_share:.1%} | {_fmt(c.get('impact'))} |"
            )
        lines += [
            "",
            "### Against the oracle strategy (the ceiling: the generator's probabilities through the same policy fit)",
            "",
            "| model | Sharpe | oracle Sharpe | capture | per fold: Sharpe / oracle |",
            "|---|---:|---:|---:|---|",
        ]
        for name, result in rows:
            folds = ", ".join(f"{_fmt(f.metrics.sharpe)} / {_fmt(f.oracle_sharpe)}" for f in result.folds)
            oracle = _fmt(result.oracle_sharpe, none="n/a (no generator oracle: real data)")
            lines.append(f"| {name} | {_fmt(result.oos.sharpe)} | {oracle} | {_fmt(result.capture)} | {folds} |")
        lines += [
            "",
            "### AUC against the oracle (same rows, same horizons)",
            "",
            "| model | scored on | horizon | rows | model AUC | 95% CI | oracle AUC | gap |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, result in sym.models.items():
            a = result.auc
            if a is None:
                lines.append(f"| {name} | - | - | - | n/a | n/a | n/a | n/a: no probabilities (an RL agent) |")
                continue
            for j, h in enumerate(a.horizons):
                oracle = _fmt(a.oracle[j]) if a.oracle else f"n/a ({a.oracle_note})"
                gap = _fmt(a.gap[j]) if a.gap else "n/a"
                ci = f"[{_fmt(a.ci_low[j])}, {_fmt(a.ci_high[j])}]" if a.ci_low else "n/a"
                lines.append(
                    f"| {name} | {a.scored_on} | {h} {a.horizon_unit} | {a.n_rows[j]:,} | {_fmt(a.model[j])} | "
                    f"{ci} | {oracle} | {gap} |"
                )
        lines.append("")
    if report.excluded:
        lines += ["## Excluded", "", "| model | symbol | fold | reason |", "|---|---|---:|---|"]
        lines += [f"| {e.model} | {e.symbol} | {e.fold} | {e.reason} |" for e in report.excluded]
    return "\n".join(lines) + "\n"


def session_curve(equity_ts: list[int], equity: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """(CME session day, cumulative PnL at that session's last bar) of a row's equity curve: the daily view
    every statistic of the report uses, without the calendar gaps between test files."""
    from alpha_core.sessions import session_days

    if not equity_ts:
        return np.zeros(0, dtype=np.int32), np.zeros(0)
    days = session_days(np.asarray(equity_ts, dtype=np.int64))
    last = np.r_[days[1:] != days[:-1], True]  # the timestamps are in time order
    return days[last], np.asarray(equity, dtype=float)[last]


def _session_axes(curves: dict[str, ModelResult]) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[tuple[int, int]]]:
    """Each curve against the session index (1 = the first session any row traded, counting only sessions with
    data), and where each fold's test file starts on that index: (index, fold) of the row with the most folds."""
    daily = {name: session_curve(r.equity_ts, r.equity) for name, r in curves.items()}
    sessions = np.unique(np.concatenate([d for d, _ in daily.values()])) if daily else np.zeros(0, dtype=np.int32)
    indexed = {name: (np.searchsorted(sessions, d) + 1, eq) for name, (d, eq) in daily.items()}
    widest = max(curves.values(), key=lambda r: len(r.folds), default=None)
    starts, at = [], 1
    for f in sorted(widest.folds, key=lambda f: f.fold) if widest else []:
        starts.append((at, f.fold))
        at += f.metrics.n_sessions
    return indexed, starts


def _equity_panel(ax, symbol: str, curves, indexed, starts) -> None:
    for name, (x, eq) in indexed.items():
        ax.plot(x, eq, label=name, linewidth=2.5 if name.startswith("ensemble") else 1.2)
    _fold_marks(ax, starts)
    ax.axhline(0, color="grey", linewidth=0.6)
    ax.set(title=f"{symbol}: out-of-sample equity (ticks, net of cost) by session", ylabel="cumulative PnL")
    ax.legend(fontsize=7, loc="best")


def _drawdown_panel(ax, symbol: str, indexed, starts) -> None:
    for name, (x, eq) in indexed.items():
        ax.plot(x, drawdown(eq), label=name, linewidth=2.0 if name.startswith("ensemble") else 1.0)
    _fold_marks(ax, starts, labels=False)
    ax.set(title=f"{symbol}: drawdown (ticks)", xlabel="session (test sessions only, in time order)")


def _fold_marks(ax, starts: list[tuple[int, int]], labels: bool = True) -> None:
    """A dotted line where each fold's test file starts, so the gaps between test quarters are visible."""
    for at, fold in starts:
        ax.axvline(at - 0.5, color="grey", linestyle=":", linewidth=0.8)
        if labels:
            ax.annotate(
                f"fold {fold}",
                (at - 0.5, 0.0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                color="grey",
                xytext=(3, 3),
                textcoords="offset points",
            )


def plot(report: EnsembleReport) -> dict[str, bytes]:
    """The report's PNG plots, by file name. Equity and drawdown run against the session index (test sessions
    only, in time order): calendar time would draw months of flat line between the folds' test quarters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = {}
    for symbol, sym in report.symbols.items():
        curves = {**sym.models, **{f"ensemble: {k}": v for k, v in sym.ensembles.items()}}
        indexed, starts = _session_axes(curves)
        fig, ax = plt.subplots(figsize=(10, 5))
        _equity_panel(ax, symbol, curves, indexed, starts)
        ax.set(xlabel="session (test sessions only, in time order)")
        written[f"{symbol}_equity.png"] = _png(fig)
        fig, ax = plt.subplots(figsize=(10, 3))
        _drawdown_panel(ax, symbol, indexed, starts)
        written[f"{symbol}_drawdown.png"] = _png(fig)
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, height_ratios=[2, 1])
        _equity_panel(top, symbol, curves, indexed, starts)
        _drawdown_panel(bottom, symbol, indexed, starts)
        written[f"{symbol}_equity_drawdown.png"] = _png(fig)
        fig, ax = plt.subplots(figsize=(10, 4))
        names = list(curves)
        for i, name in enumerate(names):
            folds = curves[name].folds
            sharpes = np.array([f.metrics.sharpe for f in folds])
            low = np.array(
                [
                    f.metrics.sharpe_ci_low if f.metrics.sharpe_ci_low is not None else s
                    for f, s in zip(folds, sharpes, strict=True)
                ]
            )
            high = np.array(
                [
                    f.metrics.sharpe_ci_high if f.metrics.sharpe_ci_high is not None else s
                    for f, s in zip(folds, sharpes, strict=True)
                ]
            )
            ax.bar(
                np.arange(len(sharpes)) + i / (len(names) + 1),
                sharpes,
                width=1 / (len(names) + 1),
                label=name,
                yerr=np.clip(np.vstack([sharpes - low, high - sharpes]), 0, None),
                capsize=2,
            )
        ax.set(title=f"{symbol}: Sharpe per fold (bootstrap 95% interval)", xlabel="fold")
        ax.legend(fontsize=7)
        written[f"{symbol}_fold_sharpe.png"] = _png(fig)
        plt.close("all")
    return written


def epoch_curves(epoch_metrics: list[dict], title: str) -> bytes | None:
    """A training summary's `epoch_metrics` as one PNG: train and validation loss, and the validation AUC per
    horizon (supervised, book) or the validation Sharpe and mean reward (RL), against the epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if not epoch_metrics:
        return None
    epochs = [row.get("epoch", i) for i, row in enumerate(epoch_metrics)]
    keys = [k for k in epoch_metrics[0] if k != "epoch"]

    def column(key: str) -> np.ndarray:
        return np.array([row.get(key, np.nan) if row.get(key) is not None else np.nan for row in epoch_metrics], dtype=float)

    losses = [k for k in keys if k.endswith("loss")]
    scores = [k for k in keys if k.startswith("val_auc")] or [k for k in keys if k in ("val_sharpe", "val_mean_reward")]
    panels = [(losses, "loss"), (scores, "AUC" if any(k.startswith("val_auc") for k in scores) else "validation")]
    panels = [(ks, label) for ks, label in panels if ks]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.0), squeeze=False)
    for ax, (ks, label) in zip(axes[0], panels, strict=True):
        for k in ks:
            ax.plot(epochs, column(k), marker="o", markersize=3, label=k)
        if label == "AUC":
            ax.axhline(0.5, color="grey", linestyle=":", linewidth=0.8)
        ax.set(xlabel="epoch", ylabel=label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    data = _png(fig, dpi=80)
    plt.close(fig)
    return data


def _png(fig, dpi: int = 100) -> bytes:
    import io

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def write_report(report: EnsembleReport, path: Path) -> None:
    """The report's files appear as one set, of one writer. The writer holds the report's lock (a second
    `alpha evaluate` into the same output fails fast, naming the first). The JSON is the commit point: the old
    one goes first, the new one is written last and lists the checksums of the Markdown and plots as this writer
    made them, so a crash in between leaves no report at all (never a new plot beside an old JSON), and
    `load_report` proves the set on disk is this writer's. Every commit of the set checks the lock's fence first
    (`alpha_core.atomic.guard`): a writer frozen past the lock's staleness, whose set another writer has since
    written, stops at its next file (`LockLost`, exit 2) and leaves that set whole."""
    lock = Lock(path.with_name(f".{path.name}.lock"), run=secrets.token_hex(6), step=str(path))
    companions = {path.with_suffix(".md").name: markdown(report).encode(), **plot(report), **tables(report, path.stem)}
    files = {name: hashlib.sha256(data).hexdigest() for name, data in companions.items()}
    with lock.hold(), contextlib.ExitStack() as fenced:
        for name in (path.name, *companions):
            fenced.enter_context(guard(path.parent / name, lock.check))
        lock.check()
        path.unlink(missing_ok=True)
        for name, data in companions.items():
            atomic_write_bytes(path.parent / name, data)
        crash_point("report.before_json")
        atomic_write_json(path, report.model_copy(update={"files": files}).model_dump(mode="json"))


def load_report(path: str | Path) -> EnsembleReport:
    """A report whose Markdown and plots are exactly those written with it (DataError otherwise)."""
    path = Path(path)
    report = EnsembleReport.model_validate_json(path.read_text())
    for name, digest in report.files.items():
        companion = path.parent / name
        if not companion.is_file() or hashlib.sha256(companion.read_bytes()).hexdigest() != digest:
            raise DataError(companion, "missing or not the one written with this report (a mixed or partial set)")
    return report
