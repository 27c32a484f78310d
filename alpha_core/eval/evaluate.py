"""`alpha evaluate`: honest walk-forward backtests of every checkpoint, and the ensemble, per symbol.

For each `models/<model>/<symbol>/fold-<k>/` checkpoint, predictions are made on that fold's TEST file
only (never data its training, early stopping or hyperparameter search saw) and turned into bar positions on
one decision clock (see predict.py; `check_decision_clock` refuses any model that trades on data from after
its entry price). A bar's PnL is the position held over the next bar times that bar's move in ticks, minus
`cost_ticks` per unit of position change. The folds' test files, in time order, form one out-of-sample series
per model. Two ensembles are reported: equal weight, and weights fitted on the VALIDATION files only (each
model's validation Sharpe, floored at 0; equal weights when none is positive). That Sharpe is the one the
checkpoint's trainer recorded (`validation.py`: the evaluator's own number, computed once per checkpoint); a
validation file is predicted here only where no record fits this report's settings, and only for test files
that two or more models share (one model's weight is 1 whatever its Sharpe).

Multiple testing: a row's DSR counts N = the hyperopt trials behind its checkpoints x the configurations the
report compares (its model and ensemble rows). The search behind a checkpoint is the one its summary records
(the results.json its params came from: the same record whichever door trained it), else a `hyperopt_results`
file given for the model, else `<run>/hyperopt/<model>/<symbol>/results.json` beside `<run>/models` (the
original layout). V is the variance of N zero-skill Sharpe estimates of the test's length: the null variance
1/(T-1) plus the dispersion of the trials' true per-session Sharpe (`metrics.trials_sharpe_dispersion`: counted
only where the trials differ beyond their sampling noise); each row also shows the DSR at the null variance.
Each model's AUC is set beside the demo oracle's on the same rows and horizons it was scored on (the book model on its own book
labels, on a fixed seeded sample of the test file's snapshots: `predict.auc_rows`), with its 95% DeLong
interval. Checkpoints that are missing, unreadable, without a test file, of an unknown symbol, with a failed
gate or tuned on their test file are listed with the reason, never silently dropped; so is every `expected`
(model, fold) that has no checkpoint at all.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from alpha_core import artifacts, cpus, metrics, progress
from alpha_core.data.dbn import MBP10, OHLCV_1M
from alpha_core.data.loader import take_rows
from alpha_core.data.oracle import oracle_auc, oracle_probabilities
from alpha_core.data.predecode import predecode, quarter_sidecars, symbol_dir
from alpha_core.data.products import PRODUCTS
from alpha_core.data.sidecar import BARS, BOOK, HORIZON_UNIT, Sidecar
from alpha_core.devices import resolve_device
from alpha_core.errors import DataError, PlanError
from alpha_core.eval import blindness, validation
from alpha_core.eval import policy as policies
from alpha_core.eval.configs import ENSEMBLES, EvalConfig
from alpha_core.eval.predict import (
    AUC_SAMPLE,
    Checkpoint,
    DecisionClockError,
    Loaded,
    Prediction,
    book_decision_rows,
    check_decision_clock,
    entry_ts,
    load,
    one_intra_op_thread,
    predict,
)
from alpha_core.eval.report import (
    AucComparison,
    EnsembleReport,
    Excluded,
    FoldResult,
    Metrics,
    ModelResult,
    SymbolReport,
    write_report,
)
from alpha_core.eval.validation import next_move_ticks
from alpha_core.gates import GateThresholds, check_gate
from alpha_core.models import registry
from alpha_core.params import HyperoptRecord, load_params_file

# trials assumed behind params whose search is unknown (a plain params file: e.g. a search's best_params copied out of
# its results.json); a moderate search's size, stated in the row (docs/validity.md)
ASSUMED_SEARCH_TRIALS = 100


def find_checkpoints(
    models_dir: Path, symbols: list[str] | None, gate: GateThresholds | None = None
) -> tuple[list[Checkpoint], list[Excluded]]:
    """The readable checkpoints under models_dir/<model>/<symbol>/fold-<k> that pass `gate`, and the others with
    the reason. Each is read from the attempt its fold folder shows now (a training that promotes another one
    meanwhile changes nothing this evaluation reads), and a row never mixes the folds of two CLI runs."""
    found, excluded = [], []
    for fold_dir in sorted(models_dir.glob("*/*/fold-*")):
        model, symbol = fold_dir.parent.parent.name, fold_dir.parent.name
        if symbols and symbol not in symbols:
            continue
        if symbol not in PRODUCTS:
            excluded.append(
                Excluded(
                    model=model,
                    symbol=symbol,
                    fold=None,
                    reason=(f"{fold_dir.parent}: {symbol} is not a known symbol ({', '.join(PRODUCTS)})"),
                )
            )
            continue
        suffix = fold_dir.name.split("-", 1)[1]
        if not suffix.isdigit():
            excluded.append(
                Excluded(
                    model=model, symbol=symbol, fold=None, reason=f"{fold_dir}: not a checkpoint folder (expected fold-<k>)"
                )
            )
            continue
        fold = int(suffix)
        fold_dir = fold_dir.resolve()  # the attempt itself: read by its name from here on
        try:
            spec = registry.get(model)
        except Exception as exc:
            excluded.append(Excluded(model=model, symbol=symbol, fold=fold, reason=str(exc)))
            continue
        problems = artifacts.verify(fold_dir, deep=True)  # a crashed attempt, or files of two runs mixed
        if problems:
            excluded.append(Excluded(model=model, symbol=symbol, fold=fold, reason=f"unreadable: {problems[0]}"))
            continue
        summary_name = spec.kind.summary_file
        try:
            summary = json.loads((fold_dir / summary_name).read_text())
        except (OSError, ValueError) as exc:
            excluded.append(Excluded(model=model, symbol=symbol, fold=fold, reason=f"unreadable: {summary_name} ({exc})"))
            continue
        if gate is not None:
            try:
                value, loss = spec.kind.gated_value(summary)
            except (KeyError, TypeError, ValueError) as exc:
                excluded.append(
                    Excluded(
                        model=model,
                        symbol=symbol,
                        fold=fold,
                        reason=f"unreadable: {summary_name} has no gated metric ({exc!r})",
                    )
                )
                continue
            result = check_gate(spec.kind, value, gate, loss)
            if not result.passed:
                excluded.append(Excluded(model=model, symbol=symbol, fold=fold, reason=f"gate failed: {result.reason}"))
                continue
        ckpt = Checkpoint(model, symbol, fold, fold_dir, spec.kind, summary)
        if not ckpt.weights.exists():
            excluded.append(Excluded(model=model, symbol=symbol, fold=fold, reason=f"unreadable: missing {ckpt.weights.name}"))
            continue
        found.append(ckpt)
    return _one_run_per_row(found, excluded)


def _one_run_per_row(found: list[Checkpoint], excluded: list[Excluded]) -> tuple[list[Checkpoint], list[Excluded]]:
    """Folds trained by the CLI with the same settings are one unit (`unit` in their summaries, a digest of those
    settings), whether one call trained them all or one call each: where a model's folds come from two units (a
    rerun with other settings, killed midway), the newest unit's folds are kept, the others listed. Folds promoted
    one by one (Dagster's, whose report picks them by lineage) have no unit."""
    kept = []
    by_row: dict[tuple[str, str], list[Checkpoint]] = defaultdict(list)
    for c in found:
        by_row[(c.model, c.symbol)].append(c)
    for ckpts in by_row.values():
        units = {c.summary.get("unit") for c in ckpts} - {None}
        if len(units) < 2:
            kept += ckpts
            continue
        newest = max((c for c in ckpts if c.summary.get("unit")), key=lambda c: _completed(c.path)).summary["unit"]
        for c in ckpts:
            if c.summary.get("unit") in (None, newest):
                kept.append(c)
            else:
                excluded.append(
                    Excluded(
                        model=c.model,
                        symbol=c.symbol,
                        fold=c.fold,
                        reason=(
                            f"trained with other settings (unit {c.summary['unit']}) than the newest folds of this row "
                            f"(unit {newest}): a row never mixes settings (train this fold again with the newest)"
                        ),
                    )
                )
    return kept, excluded


def _completed(path: Path) -> str:
    return json.loads((path / artifacts.MANIFEST).read_text())["completed"]


def load_search(path: Path, model: str) -> HyperoptRecord:
    """A hyperopt results.json given by path; anything unusable is a DataError naming the file and the field."""
    if not Path(path).is_file():
        raise DataError(path, "no such hyperopt results file")
    try:
        record = load_params_file(path).hyperopt
    except PlanError as exc:
        raise DataError(None, str(exc)) from exc
    if record is None:
        raise DataError(path, "not a hyperopt results.json (no best_params and trials)")
    if record.model != model:
        raise DataError(path, f"model: expected {model!r}, found {record.model!r}")
    return record


def search_behind(ckpt: Checkpoint, cfg: EvalConfig) -> HyperoptRecord | None:
    """The search whose params trained `ckpt`: its summary's record, else a results file given for the model,
    else the original layout's `<run>/hyperopt/<model>/<symbol>/results.json` beside `<run>/models`."""
    if ckpt.summary.get("hyperopt"):
        return HyperoptRecord.model_validate(ckpt.summary["hyperopt"])
    given = cfg.hyperopt_results.get(f"{ckpt.model}/{ckpt.symbol}") or cfg.hyperopt_results.get(ckpt.model)
    layout = cfg.models_dir.parent / "hyperopt" / ckpt.model / ckpt.symbol / "results.json"
    path = given or (layout if layout.is_file() else None)
    return None if path is None else load_search(path, ckpt.model)


@torch.no_grad()
def evaluate(cfg: EvalConfig) -> EnsembleReport:
    cpus.apply()  # threads for the CPUs this step was given (alpha_core/cpus.py)
    device = resolve_device(cfg.device)
    with one_intra_op_thread() if device.type == "cpu" else nullcontext():  # CPU: parallel over batches instead
        return _evaluate(cfg, device)


def _evaluate(cfg: EvalConfig, device: torch.device) -> EnsembleReport:
    checkpoints, excluded = find_checkpoints(cfg.models_dir, cfg.symbols, cfg.gate)
    excluded += cfg.upstream_excluded
    predecoded = cfg.predecoded_dir or cfg.output.parent / ".predecoded"
    by_symbol: dict[str, list[Checkpoint]] = defaultdict(list)
    for c in checkpoints:
        by_symbol[c.symbol].append(c)
    if cfg.expected is not None:
        present = {(e.model, e.symbol, e.fold) for e in excluded} | {(c.model, c.symbol, c.fold) for c in checkpoints}
        for symbol in cfg.symbols or sorted({s for _, s, _ in present}):
            excluded += [
                Excluded(model=m, symbol=symbol, fold=k, reason="never materialized")
                for m, k in cfg.expected
                if (m, symbol, k) not in present
            ]
    symbols = {}
    for symbol, ckpts in sorted(by_symbol.items()):
        try:
            folder = symbol_dir(cfg.data_dir, symbol)
        except DataError as exc:  # one symbol without data: its checkpoints are listed, the others evaluated
            excluded += [Excluded(model=c.model, symbol=symbol, fold=c.fold, reason=f"no data: {exc}") for c in ckpts]
            continue
        # calendar quarter ("2024-Q3") -> its rows, whatever the files' split: what summaries name (`folds.py`)
        # without their first `embargo_sessions` sessions, as the fold plan cut the trainers' validation quarters
        bars = quarter_sidecars(
            [i.sidecar for i in predecode(folder, predecoded / symbol, symbol, OHLCV_1M)], cfg.embargo_sessions
        )
        n_horizons = min((len(sc.meta.horizons) for sc in bars.values()), default=0)
        if cfg.horizon >= n_horizons:
            raise PlanError(f"horizon {cfg.horizon} is not an index into the {n_horizons} horizons of {symbol}'s bars")
        book_items = predecode(folder, predecoded / symbol, symbol, MBP10) if any(c.trainer.reads_book for c in ckpts) else []
        book = quarter_sidecars([i.sidecar for i in book_items], cfg.embargo_sessions)
        symbols[symbol] = _evaluate_symbol(cfg, symbol, ckpts, bars, book, excluded, device)
    report = EnsembleReport(
        created=dt.datetime.now(dt.UTC).isoformat(),
        models_dir=str(cfg.models_dir),
        horizon_index=cfg.horizon,
        band=cfg.band,
        cost_ticks=cfg.cost_ticks,
        policy=cfg.policy,
        symbols=symbols,
        excluded=excluded,
        run_id=cfg.run_id,
        reused=cfg.reused,
    )
    write_report(report, cfg.output)
    return report


@dataclass
class Scored:
    """What one fold's test file contributes to a row: positions on the clock and the rows its AUC is scored on."""

    fold: int
    test_file: str
    prediction: Prediction
    mask: np.ndarray | None = None  # [scored rows, H] rows scored per horizon (a prediction and a label)
    labels: np.ndarray | None = None  # [scored rows, H] their labels
    weights: dict[str, float] | None = None  # ensembles
    search: HyperoptRecord | None = None  # the hyperparameter search behind the checkpoint
    checkpoint: str | None = None  # the attempt folder its weights were read from
    fit: validation.PolicyFit | None = None  # the policy fitted on its validation file (None: fixed rule, RL)
    unknown_search: str | None = None  # the params file it was trained with, which carries no search record


def _predict_checked(
    model: Loaded,
    file: str,
    bars: Sidecar,
    book: Sidecar | None,
    cfg: EvalConfig,
    entry: np.ndarray,
    scored: bool = True,
    policy: policies.Policy | None = None,
) -> Prediction:
    pred = predict(model, bars, book, cfg.horizon, cfg.band, scored, entry, policy)
    check_decision_clock(model.ckpt.model, file, np.asarray(bars.ts), pred.position, pred.decision_ts, entry)
    return pred


def _unusable(ckpt: Checkpoint, cfg: EvalConfig, test_files: list[str]) -> tuple[str | None, HyperoptRecord | None]:
    """(why the checkpoint cannot be reported, or None; the search behind it)."""
    if not test_files:
        return "no test quarter", None
    recorded = ckpt.summary.get("embargo_sessions")  # None: trained before plans recorded it
    if recorded is not None and recorded != cfg.embargo_sessions:
        return (
            f"its fold plan embargoed {recorded} session(s) of its validation quarter, this evaluation embargoes "
            f"{cfg.embargo_sessions} (evaluate with --embargo-sessions {recorded})"
        ), None
    try:
        search = search_behind(ckpt, cfg)
    except DataError as exc:
        return f"unreadable hyperopt results: {exc}", None
    leaks = ckpt.summary.get("hyperopt_leakage") or []
    if leaks:
        return f"trained with --allow-hyperopt-leakage: {'; '.join(leaks)}", search
    if search is not None and test_files[0] in {*search.train_files, *search.val_files}:
        return f"hyperopt trained or validated on its test quarter {test_files[0]} ({search.path})", search
    return None, search


def _lacking_quarter(ckpt: Checkpoint, name: str, bars: dict, book: dict, split: str = "test") -> str | None:
    """Why the data at hand cannot score the checkpoint: its test (or validation) quarter is not in it."""
    needed = [(OHLCV_1M, bars)] + ([(MBP10, book)] if ckpt.trainer.reads_book else [])
    for schema, have in needed:
        if name not in have:
            known = ", ".join(have) or "none"
            return f"no {schema} data for its {split} quarter {name} (the {schema} quarters at hand: {known})"
    return None


def _evaluate_symbol(cfg, symbol, ckpts, bars, book, excluded, device) -> SymbolReport:
    scored: dict[str, list[Scored]] = defaultdict(list)
    test_predictions: dict[str, dict[str, Prediction]] = defaultdict(dict)  # test file -> model -> prediction
    val_sharpe: dict[tuple[str, str], float] = {}  # (test file, model) -> validation Sharpe of that fold
    clocks: dict[str, np.ndarray] = {}  # file -> entry time of each bar (the book's close trades: one scan a file)

    def clock(name: str) -> np.ndarray:
        if name not in clocks:
            clocks[name] = entry_ts(bars[name], book.get(name))
        return clocks[name]

    def drop(ckpt: Checkpoint, reason: str) -> None:
        excluded.append(Excluded(model=ckpt.model, symbol=symbol, fold=ckpt.fold, reason=reason))

    held: dict[tuple[str, str], tuple[Checkpoint, Loaded, str]] = {}  # (test file, model) -> what its val needs
    val_of: dict[str, str] = {}  # test file -> the validation file of its fold (the oracle's policy is fitted there)
    for ckpt in progress.bar(ckpts, desc=f"evaluate {symbol}", unit="checkpoint"):
        val_files, test_files = ckpt.summary["val_files"], ckpt.summary["test_files"]
        reason, search = _unusable(ckpt, cfg, test_files)
        if reason is not None:
            drop(ckpt, reason)
            continue
        test_name, val_name = test_files[0], val_files[-1]
        lacking = _lacking_quarter(ckpt, test_name, bars, book)
        if lacking is not None:
            drop(ckpt, lacking)
            continue
        twin = next((p.fold for p in scored[ckpt.model] if p.test_file == test_name), None)
        if twin is not None:  # e.g. a fold folder copied by hand: its days would count twice
            drop(ckpt, f"tests on {test_name} like fold {twin}: one checkpoint per test quarter")
            continue
        try:
            test = bars[test_name]
            model = load(ckpt, device)
            fit = None
            if cfg.policy == "fitted" and not ckpt.trainer.trades_actions:  # the trainer's fit, or the same function here
                fit = validation.recorded_policy(ckpt, val_name, cfg.cost_ticks) or validation.fit_policy(
                    model, bars[val_name], book.get(val_name), cfg.cost_ticks, clock(val_name)
                )
            policy = None if fit is None else fit.policy
            pred = _predict_checked(model, test_name, test, book.get(test_name), cfg, clock(test_name), policy=policy)
            blind = blindness.check(model, test, book.get(test_name), pred, clock(test_name))
            labels = mask = None
            if pred.probs is not None:
                labels = take_rows(pred.scored_on, "labels", pred.rows)
                mask = np.isfinite(pred.probs) & np.isfinite(labels)
        except DecisionClockError:
            raise  # look-ahead is a bug to fix, not a checkpoint to skip
        except Exception as exc:  # an unusable checkpoint is listed, not silently dropped
            drop(ckpt, f"unreadable: {type(exc).__name__}: {exc}")
            continue
        if blind is not None:  # its positions change with the future: whatever it read, it is not reported
            drop(ckpt, blind)
            continue
        unknown = ckpt.summary.get("params_file") if search is None else None
        scored[ckpt.model].append(
            Scored(
                ckpt.fold,
                test_name,
                pred,
                mask,
                labels,
                search=search,
                checkpoint=str(ckpt.path),
                fit=fit,
                unknown_search=unknown,
            )
        )
        if fit is not None:  # the validation-weighted ensemble weighs it by its fitted policy's validation Sharpe
            val_sharpe[(test_name, ckpt.model)] = fit.sharpe
        test_predictions[test_name][ckpt.model] = pred
        held[(test_name, ckpt.model)] = (ckpt, model, val_name)
        val_of.setdefault(test_name, val_name)

    # the validation-weighted ensemble's weights: a validation Sharpe per model of each test file two or more share
    for (test_name, name), (ckpt, model, val_name) in held.items():
        if len(test_predictions[test_name]) < 2 or (test_name, name) in val_sharpe:
            continue
        sharpe = validation.recorded_sharpe(ckpt, val_name, cfg.horizon, cfg.band, cfg.cost_ticks)
        lacking = None if sharpe is not None else _lacking_quarter(ckpt, val_name, bars, book, "validation")
        try:
            if lacking is not None:
                raise LookupError(lacking)
            if sharpe is None:
                val = validation.score(
                    model, bars[val_name], book.get(val_name), cfg.horizon, cfg.band, cfg.cost_ticks, clock(val_name)
                )
                sharpe = val.sharpe
        except DecisionClockError:
            raise
        except Exception as exc:
            drop(ckpt, lacking or f"unreadable: {type(exc).__name__}: {exc}")
            scored[name] = [p for p in scored[name] if p.test_file != test_name]
            if not scored[name]:
                del scored[name]
            del test_predictions[test_name][name]
            continue
        val_sharpe[(test_name, name)] = sharpe
    held.clear()

    scored = {name: parts for name, parts in scored.items() if parts}  # a model whose every checkpoint was dropped
    # every row the report compares, times the policies each checkpoint's fit compared (the fixed rule: one)
    n_policies = max((p.fit.n_policies for parts in scored.values() for p in parts if p.fit), default=1)
    n_configs = (len(scored) + (len(ENSEMBLES) if test_predictions else 0)) * n_policies
    ceiling = {test: oracle_strategy(cfg, bars[val], bars[test]) if val in bars else None for test, val in val_of.items()}
    spreads = {test: half_spreads(bars[test], book.get(test)) for test in val_of}
    models = {
        name: _row(cfg, name, parts, bars, _distinct_searches(parts), n_configs, n_policies, ceiling, _unknown(parts), spreads)
        for name, parts in scored.items()
    }
    ensembles = {}
    if test_predictions:
        fold_of = {p.test_file: p.fold for parts in scored.values() for p in parts}  # the folds' own numbers
        searches = _distinct_searches([p for parts in scored.values() for p in parts])
        for kind in ENSEMBLES:
            parts = []
            for test_file, by_model in sorted(test_predictions.items(), key=lambda kv: bars[kv[0]].meta.first_ts):
                names = sorted(by_model)
                if kind == "equal_weight":
                    weights = np.ones(len(names))
                else:  # one model: its weight is 1 (its validation Sharpe was not needed)
                    weights = np.array([max(val_sharpe.get((test_file, n), 1.0), 0.0) for n in names])
                    weights = weights if weights.sum() > 0 else np.ones(len(names))
                weights = weights / weights.sum()
                pos = np.clip(sum(w * by_model[n].position for w, n in zip(weights, names, strict=True)), -1.0, 1.0)
                decision = np.max([by_model[n].decision_ts for n in names], axis=0)
                test = bars[test_file]
                check_decision_clock(kind, test_file, np.asarray(test.ts), pos, decision, clock(test_file))
                parts.append(
                    Scored(
                        fold_of[test_file],
                        test_file,
                        Prediction(pos, decision, None, None),
                        weights=dict(zip(names, weights.tolist(), strict=True)),
                    )
                )
            members = [p for member in scored.values() for p in member]
            ensembles[kind] = _row(cfg, kind, parts, bars, searches, n_configs, n_policies, ceiling, _unknown(members), spreads)
    return SymbolReport(models=models, ensembles=ensembles)


def oracle_strategy(cfg: EvalConfig, val: Sidecar, test: Sidecar) -> np.ndarray | None:
    """The ceiling: the generator's exact bar probabilities traded through the same decision layer as the models, the
    policy fitted on the fold's validation file (or the fixed rule), applied to its test file; None without an oracle
    (real data)."""
    p_val, p_test = oracle_probabilities(val), oracle_probabilities(test)
    if p_val is None or p_test is None:
        return None
    if cfg.policy == "fixed":
        rule = policies.fixed(cfg.horizon, cfg.band)
    else:
        holds = policies.hold_bars(val.meta.horizons, HORIZON_UNIT[BARS])
        rule = policies.fit(p_val, np.asarray(val.ts), next_move_ticks(val), cfg.cost_ticks, holds)[0]
    return policies.positions(rule, p_test)


def half_spreads(bars: Sidecar, book: Sidecar | None) -> np.ndarray | None:
    """[N bars] half the bid-ask spread in ticks at each bar's decision (the last snapshot at or before its close
    trade, from the book sidecar's `spread_ticks`), NaN where the book has none; None without a book file."""
    if book is None or "spread_ticks" not in book.meta.feature_names:
        return None
    rows = book_decision_rows(bars, book)
    out = np.full(bars.rows, np.nan)
    ok = np.flatnonzero(rows >= 0)
    order = np.argsort(rows[ok], kind="stable")
    column = book.meta.feature_names.index("spread_ticks")
    out[ok[order]] = take_rows(book, "features", rows[ok][order])[:, column].astype(np.float64) / 2.0
    return out


def _net_sharpe(ts: np.ndarray, position: np.ndarray, moves: np.ndarray, cost: float | np.ndarray) -> float:
    return metrics.sharpe(metrics.daily_pnl(ts, metrics.bar_pnl(position, moves, cost))[1])


def _unknown(parts: list[Scored]) -> list[str]:
    """The params files without a search record behind some checkpoints, each once."""
    return sorted({p.unknown_search for p in parts if p.unknown_search})


def _distinct_searches(parts: list[Scored]) -> list[HyperoptRecord]:
    """The searches behind some checkpoints, each once (the folds of one run share theirs)."""
    return list({p.search.sha256: p.search for p in parts if p.search is not None}.values())


def _row(
    cfg,
    name: str,
    parts: list[Scored],
    bars,
    searches: list[HyperoptRecord],
    n_configs: int,
    n_policies: int = 1,
    ceiling: dict[str, np.ndarray | None] | None = None,
    unknown: list[str] = (),
    spreads: dict[str, np.ndarray | None] | None = None,
) -> ModelResult:
    """One report row: every fold's test file on its own, then concatenated in time order (out of sample),
    each with N = trials x configurations and V = the null variance + the trials' dispersion."""
    sharpes = [s for search in searches for s in search.trial_sharpes]
    sessions = [t for search in searches for t in search.trial_sessions]
    dispersion = metrics.trials_sharpe_dispersion(sharpes, sessions)
    n_trials = max(1, len(sharpes) + ASSUMED_SEARCH_TRIALS * len(unknown))
    if dispersion is None:
        estimator = "null variance 1/(T-1): no hyperopt trials behind this row"
    else:
        estimator = (
            f"null variance 1/(T-1) + {dispersion:.4g}: the DerSimonian-Laird variance of {len(sharpes)} hyperopt "
            f"trials' true per-session validation Sharpe, counted only where Cochran's Q shows them apart beyond "
            f"their sampling variance (1 + SR^2/2)/T_val at the {metrics.DISPERSION_LEVEL:g} level "
            f"(T_val = {min(sessions)}-{max(sessions)} sessions)"
        )
    if unknown:
        estimator = (
            f"search unknown: {', '.join(unknown)} carries no search record, so N assumes {ASSUMED_SEARCH_TRIALS} "
            f"trials for each such file; {estimator}"
        )
    stats = dict(n_trials=n_trials * n_configs, trials_dispersion=dispersion)
    folds = []
    for part in sorted(parts, key=lambda p: p.fold):
        test = bars[part.test_file]
        summary = metrics.summarize(
            np.asarray(test.ts), part.prediction.position, next_move_ticks(test), cfg.cost_ticks, **stats
        )
        folds.append(
            FoldResult(
                fold=part.fold,
                test_file=part.test_file,
                checkpoint=part.checkpoint,
                metrics=Metrics(**summary),
                auc=_auc([part]),
                weights=part.weights,
                policy=part.prediction.policy,
                policy_val_sharpe=None if part.fit is None else part.fit.sharpe,
                policy_pbo=None if part.fit is None else part.fit.pbo,
                oracle_sharpe=None
                if (ceiling or {}).get(part.test_file) is None
                else _net_sharpe(np.asarray(test.ts), ceiling[part.test_file], next_move_ticks(test), cfg.cost_ticks),
            )
        )
    order = sorted(parts, key=lambda p: bars[p.test_file].meta.first_ts)
    ts = np.concatenate([np.asarray(bars[p.test_file].ts) for p in order])
    pos = np.concatenate([p.prediction.position for p in order])
    moves = np.concatenate([next_move_ticks(bars[p.test_file]) for p in order])
    oos = metrics.summarize(ts, pos, moves, cfg.cost_ticks, **stats)
    pnl = metrics.bar_pnl(pos, moves, cfg.cost_ticks)
    step = max(1, len(ts) // 2000)
    by_model = {"flat": _net_sharpe(ts, pos, moves, cfg.cost_ticks)}
    spread = [(spreads or {}).get(p.test_file) for p in order]
    if any(a is not None for a in spread):
        half = np.concatenate(
            [np.full(bars[p.test_file].rows, np.nan) if a is None else a for p, a in zip(order, spread, strict=True)]
        )
        cost = metrics.cost_per_unit("half_spread", pos, cfg.cost_ticks, half)
        by_model["half_spread"] = _net_sharpe(ts, pos, moves, cost)
        booked = float(np.isfinite(half).mean())
    else:
        by_model["half_spread"], booked = None, 0.0
    by_model["impact"] = _net_sharpe(ts, pos, moves, metrics.cost_per_unit("impact", pos, cfg.cost_ticks))
    oracle = [(ceiling or {}).get(p.test_file) for p in order]
    oracle_sharpe = None if any(o is None for o in oracle) else _net_sharpe(ts, np.concatenate(oracle), moves, cfg.cost_ticks)
    return ModelResult(
        name=name,
        oos=Metrics(**oos),
        folds=folds,
        auc=_auc(order),
        n_trials=n_trials,
        n_configurations=n_configs,
        n_policies=n_policies,
        search_unknown=list(unknown),
        sharpe_by_cost_model=by_model,
        half_spread_share=booked,
        oracle_sharpe=oracle_sharpe,
        capture=None if oracle_sharpe is None or oracle_sharpe <= 0 else oos["sharpe"] / oracle_sharpe,
        trials_dispersion=dispersion,
        dsr_estimator=estimator,
        hyperopt_results=[s.path for s in searches],
        equity_ts=ts[::step].tolist(),
        equity=np.cumsum(pnl)[::step].tolist(),
    )


def auc_interval(probs: np.ndarray, labels: np.ndarray, z: float = 1.959964) -> tuple[list[float], list[float]]:
    """95% interval of the AUC per horizon by DeLong et al. (1988): Var = S10/m + S01/n from the structural
    components (each positive's share of negatives ranked below it, and the converse; midranks for ties), normal
    approximation, clipped to [0, 1]; rows with a NaN label are left out, and a horizon with fewer than 2 of either
    class gets [0, 1]. It treats the rows as independent draws: for a random sample of a file's rows, the spread of
    the sample's AUC around the whole file's."""
    lows, highs = [], []
    for j in range(labels.shape[1]):
        ok = ~np.isnan(labels[:, j])
        y, p = labels[ok, j], probs[ok, j]
        pos, neg = p[y == 1.0], p[y == 0.0]
        m, n = len(pos), len(neg)
        if m < 2 or n < 2:
            lows.append(0.0)
            highs.append(1.0)
            continue
        ranks = metrics.average_ranks(np.concatenate([pos, neg]))
        v10 = (ranks[:m] - metrics.average_ranks(pos)) / n  # per positive: negatives below it
        v01 = 1.0 - (ranks[m:] - metrics.average_ranks(neg)) / m  # per negative: positives above it
        auc, half = v10.mean(), z * np.sqrt(v10.var(ddof=1) / m + v01.var(ddof=1) / n)
        lows.append(float(max(auc - half, 0.0)))
        highs.append(float(min(auc + half, 1.0)))
    return lows, highs


def _auc(parts: list[Scored]) -> AucComparison | None:
    """The model's AUC per horizon on the rows it was scored on (pooled over the parts' files: every bar, or the
    book's AUC sample), with its DeLong interval, beside the oracle's on exactly those rows and labels; None for a
    row without probabilities (RL agents, ensembles)."""
    if any(p.prediction.probs is None for p in parts):
        return None
    sidecars = [p.prediction.scored_on for p in parts]
    masks = [p.mask for p in parts]
    probs = np.concatenate([np.nan_to_num(p.prediction.probs, nan=0.5) for p in parts])
    labels = np.concatenate([np.where(p.mask, p.labels, np.nan) for p in parts]).astype(np.float64)
    model = np.atleast_1d(metrics.auc(probs, labels)).tolist()
    low, high = auc_interval(probs.astype(np.float64), labels)
    oracle = oracle_auc(sidecars, masks, [p.prediction.rows for p in parts])
    meta = sidecars[0].meta
    return AucComparison(
        scored_on="book" if meta.kind == BOOK else "bars",
        horizons=list(meta.horizons),
        horizon_unit=HORIZON_UNIT[meta.kind],
        n_rows=np.concatenate(masks).sum(axis=0).astype(int).tolist(),
        model=model,
        ci_low=low,
        ci_high=high,
        sample=AUC_SAMPLE if meta.kind == BOOK else None,
        oracle=oracle,
        gap=None if oracle is None else [o - m for o, m in zip(oracle, model, strict=True)],
        oracle_note=None if oracle is not None else "no generator oracle for these rows (real data)",
    )
