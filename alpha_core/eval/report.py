"""The ensemble report: its schema (pydantic, validated on write and read), Markdown table and PNG plots.

Files written beside `ensemble_report.json`: `ensemble_report.md` and, per symbol, `<symbol>_equity.png`
(out-of-sample equity of every model and both ensembles), `<symbol>_drawdown.png` and
`<symbol>_fold_sharpe.png`. Non-finite numbers (an infinite profit factor) are stored as null.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, field_validator

from alpha_core.atomic import atomic_write_bytes, atomic_write_json

Number = float | int | None


def _finite(values: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}


class Excluded(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    symbol: str
    fold: int | None
    reason: str


class FoldResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fold: int
    test_file: str
    metrics: dict[str, Number]
    auc_per_horizon: list[float] | None = None
    weights: dict[str, float] | None = None  # ensembles: the weight of each model

    @field_validator("metrics", mode="before")
    @classmethod
    def _finite_metrics(cls, value: dict) -> dict:
        return _finite(value)


class ModelResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    oos: dict[str, Number]  # out of sample: every fold's test file, in time order
    folds: list[FoldResult]
    n_trials: int  # hyperopt trials behind this model (for the deflated Sharpe)
    equity_ts: list[int]  # downsampled cumulative PnL (ticks) for plots
    equity: list[float]

    @field_validator("oos", mode="before")
    @classmethod
    def _finite_oos(cls, value: dict) -> dict:
        return _finite(value)


class SymbolReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: dict[str, ModelResult]
    ensembles: dict[str, ModelResult]
    oracle_auc: list[float] | None = None  # demo data: the best achievable AUC per horizon on the test files


class EnsembleReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    created: str
    models_dir: str
    horizon_index: int
    band: float
    cost_ticks: float
    symbols: dict[str, SymbolReport]
    excluded: list[Excluded]


COLUMNS = ("sharpe", "max_drawdown", "win_rate", "profit_factor", "turnover", "n_trades", "hit_rate", "psr", "dsr",
           "total_pnl")


def _fmt(value: Number) -> str:
    if value is None:
        return "inf"
    return f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"


def markdown(report: EnsembleReport) -> str:
    lines = [f"# Ensemble report ({report.created})", "",
             f"Out-of-sample walk-forward backtests; PnL in ticks, {report.cost_ticks} tick(s) per unit of turnover, "
             f"horizon index {report.horizon_index}, flat band ±{report.band}.", ""]
    for symbol, sym in report.symbols.items():
        lines += [f"## {symbol}", "", "| model | auc | " + " | ".join(COLUMNS) + " |",
                  "|---|---:|" + "---:|" * len(COLUMNS)]
        for name, result in [*sym.models.items(), *((f"**{k}**", v) for k, v in sym.ensembles.items())]:
            aucs = [f.auc_per_horizon[report.horizon_index] for f in result.folds if f.auc_per_horizon]
            auc = f"{np.mean(aucs):.3f}" if aucs else "-"
            lines.append(f"| {name} | {auc} | " + " | ".join(_fmt(result.oos.get(c)) for c in COLUMNS) + " |")
        if sym.oracle_auc:
            lines += ["", f"Oracle AUC per horizon (the generator's best possible): "
                          f"{', '.join(f'{a:.3f}' for a in sym.oracle_auc)}"]
        lines.append("")
    if report.excluded:
        lines += ["## Excluded", "", "| model | symbol | fold | reason |", "|---|---|---:|---|"]
        lines += [f"| {e.model} | {e.symbol} | {e.fold} | {e.reason} |" for e in report.excluded]
    return "\n".join(lines) + "\n"


def plot(report: EnsembleReport, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for symbol, sym in report.symbols.items():
        curves = {**sym.models, **{f"ensemble: {k}": v for k, v in sym.ensembles.items()}}
        fig, ax = plt.subplots(figsize=(10, 5))
        for name, r in curves.items():
            ax.plot(np.asarray(r.equity_ts, dtype="datetime64[ns]"), r.equity, label=name,
                    linewidth=2.5 if name.startswith("ensemble") else 1.0)
        ax.set(title=f"{symbol}: out-of-sample equity (ticks)", ylabel="cumulative PnL")
        ax.legend(fontsize=7)
        written.append(_save(fig, out_dir / f"{symbol}_equity.png"))
        fig, ax = plt.subplots(figsize=(10, 3))
        for name, r in curves.items():
            eq = np.asarray(r.equity, dtype=float)
            ax.plot(np.asarray(r.equity_ts, dtype="datetime64[ns]"), eq - np.maximum.accumulate(np.r_[0.0, eq])[1:],
                    label=name)
        ax.set(title=f"{symbol}: drawdown (ticks)")
        written.append(_save(fig, out_dir / f"{symbol}_drawdown.png"))
        fig, ax = plt.subplots(figsize=(10, 4))
        names = list(curves)
        for i, name in enumerate(names):
            sharpes = [f.metrics.get("sharpe") or 0.0 for f in curves[name].folds]
            ax.bar(np.arange(len(sharpes)) + i / (len(names) + 1), sharpes, width=1 / (len(names) + 1), label=name)
        ax.set(title=f"{symbol}: Sharpe per fold", xlabel="fold")
        ax.legend(fontsize=7)
        written.append(_save(fig, out_dir / f"{symbol}_fold_sharpe.png"))
        plt.close("all")
    return written


def _save(fig, path: Path) -> Path:
    import io

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    return atomic_write_bytes(path, buf.getvalue())


def write_report(report: EnsembleReport, path: Path) -> None:
    atomic_write_json(path, report.model_dump(mode="json"))
    atomic_write_bytes(path.with_suffix(".md"), markdown(report).encode())
    plot(report, path.parent)


def load_report(path: str | Path) -> EnsembleReport:
    return EnsembleReport.model_validate_json(Path(path).read_text())
