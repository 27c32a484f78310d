"""`alpha evaluate`: honest walk-forward backtests of every checkpoint, and the ensemble, per symbol.

For each `models/<model>/<symbol>/fold-<k>/` checkpoint, predictions are made on that fold's TEST file
only (never data its training or early stopping saw) and turned into bar positions (see predict.py). A bar's
PnL is the position held over the next bar times that bar's move in ticks, minus `cost_ticks` per unit of
position change. The folds' test files, in time order, form one out-of-sample series per model. Two
ensembles are reported: equal weight, and weights fitted on the VALIDATION files only (each model's
validation Sharpe, floored at 0; equal weights when none is positive). Models that are missing or fail to
load are listed with the reason, never silently dropped.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from alpha_core.bounds import NonNegFloat, NonNegInt
from alpha_core.data.dbn import MBP10, OHLCV_1M
from alpha_core.data.oracle import oracle_auc
from alpha_core.data.predecode import predecode, symbol_dir
from alpha_core.data.sidecar import Sidecar
from alpha_core.eval import metrics
from alpha_core.eval.predict import (
    Checkpoint,
    perception_bar_probs,
    positions_from_probs,
    rl_positions,
    supervised_probs,
)
from alpha_core.eval.report import EnsembleReport, Excluded, FoldResult, ModelResult, SymbolReport, write_report
from alpha_core.models import registry
from alpha_core.train.perception import resolve_device


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    models_dir: Path
    data_dir: Path
    output: Path  # ensemble_report.json; the Markdown and PNGs go beside it
    symbols: list[str] | None = None
    horizon: NonNegInt = 0  # index into the sidecar horizons (0 = shortest); checked against them in evaluate()
    band: float = Field(0.05, ge=0, lt=0.5)  # flat while |P(up) - 0.5| <= band
    cost_ticks: NonNegFloat = 1.0  # per unit of position change (a 2-tick round trip)
    predecoded_dir: Path | None = None
    device: str | None = None


def find_checkpoints(models_dir: Path, symbols: list[str] | None) -> tuple[list[Checkpoint], list[Excluded]]:
    found, excluded = [], []
    for fold_dir in sorted(models_dir.glob("*/*/fold-*")):
        model, symbol = fold_dir.parent.parent.name, fold_dir.parent.name
        if symbols and symbol not in symbols:
            continue
        fold = int(fold_dir.name.split("-", 1)[1])
        try:
            spec = registry.get(model)
        except Exception as exc:
            excluded.append(Excluded(model=model, symbol=symbol, fold=fold, reason=str(exc)))
            continue
        summary_name = "alpha_train_summary.json" if spec.trainer == "perception" else "summary.json"
        try:
            summary = json.loads((fold_dir / summary_name).read_text())
        except (OSError, ValueError) as exc:
            excluded.append(Excluded(model=model, symbol=symbol, fold=fold, reason=f"{summary_name} unreadable ({exc})"))
            continue
        if summary.get("gate_passed") is False:
            excluded.append(Excluded(model=model, symbol=symbol, fold=fold, reason="its gate failed upstream"))
            continue
        ckpt = Checkpoint(model, symbol, fold, fold_dir, spec.trainer, summary)
        if not ckpt.weights.exists():
            excluded.append(Excluded(model=model, symbol=symbol, fold=fold, reason=f"missing {ckpt.weights.name}"))
            continue
        found.append(ckpt)
    return found, excluded


def _split_files(ckpt: Checkpoint, book_order: list[str]) -> tuple[list[str], list[str]]:
    """(validation files, test files) of a checkpoint's fold; the perception summary names no test file."""
    if ckpt.trainer != "perception":
        return ckpt.summary["val_files"], ckpt.summary["test_files"]
    val = ckpt.summary["val_files"]
    after = book_order.index(val[-1]) + 1
    return val, book_order[after : after + 1]


def _bar_positions(ckpt, bars: Sidecar, book: Sidecar | None, cfg: EvalConfig, device) -> tuple[np.ndarray, np.ndarray | None]:
    if ckpt.trainer == "rl":
        return rl_positions(ckpt, bars, device), None
    probs = perception_bar_probs(ckpt, book, bars, device) if ckpt.trainer == "perception" else supervised_probs(
        ckpt, bars, device)
    return positions_from_probs(np.nan_to_num(probs[:, cfg.horizon], nan=0.5), cfg.band), probs


def _next_move_ticks(bars: Sidecar) -> np.ndarray:
    price = np.asarray(bars.price)
    return np.append(np.diff(price), 0.0) / bars.meta.tick_size


def _n_trials(models_dir: Path, model: str, symbol: str) -> int:
    results = models_dir.parent / "hyperopt" / model / symbol / "results.json"
    try:
        return max(1, len(json.loads(results.read_text())["trials"]))
    except (OSError, ValueError, KeyError):
        return 1


@torch.no_grad()
def evaluate(cfg: EvalConfig) -> EnsembleReport:
    device = resolve_device(cfg.device)
    checkpoints, excluded = find_checkpoints(cfg.models_dir, cfg.symbols)
    predecoded = cfg.predecoded_dir or cfg.output.parent / ".predecoded"
    by_symbol: dict[str, list[Checkpoint]] = defaultdict(list)
    for c in checkpoints:
        by_symbol[c.symbol].append(c)
    symbols = {}
    for symbol, ckpts in sorted(by_symbol.items()):
        folder = symbol_dir(cfg.data_dir, symbol)
        bars = {i.sidecar.meta.source.name: i.sidecar for i in predecode(folder, predecoded / symbol, symbol, OHLCV_1M)}
        book_items = predecode(folder, predecoded / symbol, symbol, MBP10) if any(
            c.trainer == "perception" for c in ckpts) else []
        book = {i.sidecar.meta.source.name: i.sidecar for i in book_items}
        symbols[symbol] = _evaluate_symbol(cfg, symbol, ckpts, bars, book, excluded, device)
    report = EnsembleReport(
        created=dt.datetime.now(dt.UTC).isoformat(), models_dir=str(cfg.models_dir), horizon_index=cfg.horizon,
        band=cfg.band, cost_ticks=cfg.cost_ticks, symbols=symbols, excluded=excluded,
    )
    write_report(report, cfg.output)
    return report


def _evaluate_symbol(cfg, symbol, ckpts, bars, book, excluded, device) -> SymbolReport:
    book_order = list(book)
    per_model: dict[str, list[FoldResult]] = defaultdict(list)
    test_positions: dict[str, dict[str, np.ndarray]] = defaultdict(dict)  # test file -> model -> positions
    val_sharpe: dict[tuple[str, str], float] = {}  # (test file, model) -> validation Sharpe of that fold
    for ckpt in ckpts:
        val_files, test_files = _split_files(ckpt, book_order)
        if not test_files:
            excluded.append(Excluded(model=ckpt.model, symbol=symbol, fold=ckpt.fold, reason="fold has no test file"))
            continue
        try:
            test, val = bars[test_files[0]], bars[val_files[-1]]
            pos, probs = _bar_positions(ckpt, test, book.get(test_files[0]), cfg, device)
            val_pos, _ = _bar_positions(ckpt, val, book.get(val_files[-1]), cfg, device)
        except Exception as exc:  # a checkpoint that cannot be used is reported, not silently dropped
            excluded.append(Excluded(model=ckpt.model, symbol=symbol, fold=ckpt.fold, reason=f"{type(exc).__name__}: {exc}"))
            continue
        stats = metrics.summarize(np.asarray(test.ts), pos, _next_move_ticks(test), cfg.cost_ticks)
        aucs = None
        if probs is not None:  # bars before the first full window have no prediction: no AUC there either
            labels = np.where(np.isnan(probs), np.nan, np.asarray(test.labels))
            aucs = metrics.auc(np.nan_to_num(probs, nan=0.5), labels).tolist()
        per_model[ckpt.model].append(FoldResult(fold=ckpt.fold, test_file=test.meta.source.name, metrics=stats,
                                                auc_per_horizon=aucs))
        test_positions[test_files[0]][ckpt.model] = pos
        val_sharpe[(test_files[0], ckpt.model)] = metrics.summarize(
            np.asarray(val.ts), val_pos, _next_move_ticks(val), cfg.cost_ticks)["sharpe"]

    models = {name: _combine(cfg, symbol, name, folds, bars, test_positions) for name, folds in per_model.items()}
    ensembles = {}
    for kind in ("equal_weight", "validation_weighted"):
        folds, series = [], {}
        for test_file, by_model in sorted(test_positions.items(), key=lambda kv: bars[kv[0]].meta.first_ts):
            names = sorted(by_model)
            if kind == "equal_weight":
                weights = np.ones(len(names))
            else:
                weights = np.array([max(val_sharpe[(test_file, n)], 0.0) for n in names])
                weights = weights if weights.sum() > 0 else np.ones(len(names))
            weights = weights / weights.sum()
            pos = np.clip(sum(w * by_model[n] for w, n in zip(weights, names, strict=True)), -1.0, 1.0)
            series[test_file] = pos
            test = bars[test_file]
            stats = metrics.summarize(np.asarray(test.ts), pos, _next_move_ticks(test), cfg.cost_ticks)
            folds.append(FoldResult(fold=len(folds), test_file=test_file, metrics=stats,
                                    weights=dict(zip(names, weights.tolist(), strict=True))))
        if folds:
            ensembles[kind] = _oos(cfg, kind, folds, series, bars, n_trials=len(models))
    test_sidecars = [bars[f] for f in sorted(test_positions, key=lambda f: bars[f].meta.first_ts)]
    oracle = oracle_auc(test_sidecars) if test_sidecars else None
    return SymbolReport(models=models, ensembles=ensembles, oracle_auc=oracle)


def _combine(cfg, symbol, name, folds, bars, test_positions) -> ModelResult:
    series = {f.test_file: test_positions[f.test_file][name] for f in folds}
    return _oos(cfg, name, folds, series, bars, n_trials=_n_trials(cfg.models_dir, name, symbol))


def _oos(cfg, name, folds, series: dict[str, np.ndarray], bars, n_trials: int) -> ModelResult:
    """Concatenate the folds' test files (time order) into one out-of-sample series."""
    files = sorted(series, key=lambda f: bars[f].meta.first_ts)
    ts = np.concatenate([np.asarray(bars[f].ts) for f in files])
    pos = np.concatenate([series[f] for f in files])
    moves = np.concatenate([_next_move_ticks(bars[f]) for f in files])
    stats = metrics.summarize(ts, pos, moves, cfg.cost_ticks, n_trials=n_trials)
    pnl = metrics.bar_pnl(pos, moves, cfg.cost_ticks)
    return ModelResult(name=name, oos=stats, folds=sorted(folds, key=lambda f: f.fold), n_trials=n_trials,
                       equity_ts=ts[:: max(1, len(ts) // 2000)].tolist(),
                       equity=np.cumsum(pnl)[:: max(1, len(ts) // 2000)].tolist())
