"""`alpha compare RUN_A RUN_B ...`: the headline rows of several runs side by side, and what differs between them
(the report's settings, each model's training settings and params, the data it trained and tested on, the code
versions), read from the reports and the checkpoints' summaries they name. The Dagster `run_comparison` asset
shows the same text."""

from __future__ import annotations

import json
import os
from pathlib import Path

from alpha_core.errors import DataError
from alpha_core.eval.report import EnsembleReport, load_report, verdict

REPORT_SETTINGS = ("cost_ticks", "band", "horizon_index")
SUMMARY_SKIP = {"epoch_metrics", "attempt", "unit", "wall_time_s", "sequences_per_s", "env_steps_per_s", "created"}


def storage_root() -> Path:
    return Path(os.environ.get("ALPHA_STORAGE_ROOT", "storage"))


def find_reports(run: str, root: Path) -> dict[str, Path]:
    """symbol -> report JSON of a run given by RUN_ID (under the storage root) or by a report file or folder."""
    given = Path(run)
    if given.is_file():
        return {symbol: given for symbol in json.loads(given.read_text()).get("symbols", {})}
    folder = given if given.is_dir() and (given / "eval").is_dir() else root / run
    found = {p.parent.name: p for p in sorted((folder / "eval").glob("*/ensemble_report.json"))}
    if not found:
        raise DataError(folder / "eval", f"no ensemble_report.json of run {run!r} (is it a RUN_ID under {root}?)")
    return found


def _checkpoint_settings(report: EnsembleReport, symbol: str) -> dict[str, dict]:
    """model -> what its checkpoints were trained with (the first fold's summary, less volatile fields), plus every
    fold's train and test files and the code versions."""
    out = {}
    for name, row in report.symbols[symbol].models.items():
        summaries = []
        for fold in row.folds:
            folder = Path(fold.checkpoint or "")
            path = next((folder / n for n in ("summary.json", "alpha_train_summary.json") if (folder / n).is_file()), None)
            if fold.checkpoint and path is not None:
                summaries.append((fold.fold, json.loads(path.read_text())))
        if not summaries:
            continue
        settings = {
            k: v
            for k, v in summaries[0][1].items()
            if k not in SUMMARY_SKIP and not _is_metric(k) and (k in ("params", "versions") or not isinstance(v, list | dict))
        }
        settings["data"] = {f"fold {k}": {"train": s.get("train_files"), "test": s.get("test_files")} for k, s in summaries}
        out[name] = settings
    return out


def _is_metric(key: str) -> bool:
    """What training measured rather than what it was told (compared in the headline, not as settings)."""
    return key.startswith(("best_", "final_", "val_", "n_train_seqs_consumed", "n_val_seqs_consumed")) or key in (
        "epochs",
        "early_stopped",
        "checkpoint_epoch",
        "device",
    )


def _cell(row) -> str:
    if row is None:
        return "-"
    return f"{row.oos.sharpe:.2f} ({'n/a' if row.oos.dsr is None else f'{row.oos.dsr:.2f}'})"


def _flatten(value, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def compare(runs: list[str], root: Path | None = None) -> str:
    """The comparison in plain text (Markdown-friendly): per symbol, each row's Sharpe and DSR in every run, each
    run's verdict, then every setting that differs between the runs."""
    root = root or storage_root()
    reports = {run: {s: load_report(p) for s, p in find_reports(run, root).items()} for run in runs}
    symbols = sorted({s for by_symbol in reports.values() for s in by_symbol})
    lines = []
    for symbol in symbols:
        present = {run: by_symbol[symbol] for run, by_symbol in reports.items() if symbol in by_symbol}
        names = list(
            dict.fromkeys(n for r in present.values() for n in [*r.symbols[symbol].models, *r.symbols[symbol].ensembles])
        )
        width = max([len(n) for n in names] + [5])
        head = "".join(f" | {run[:22]:>22}" for run in present)
        lines += [f"{symbol}: out-of-sample Sharpe (DSR) per run", f"  {'row':<{width}}{head}"]
        for name in names:
            cells = [
                _cell(r.symbols[symbol].models.get(name) or r.symbols[symbol].ensembles.get(name)) for r in present.values()
            ]
            lines.append(f"  {name:<{width}}" + "".join(f" | {c:>22}" for c in cells))
        lines += [f"  {run}: {verdict(r.symbols[symbol])}" for run, r in present.items()]
        trained = {run: _checkpoint_settings(r, symbol) for run, r in present.items()}
        in_every_run = set.intersection(*(set(models) for models in trained.values()))
        settings = {
            run: _flatten(
                {
                    "report": {k: getattr(r, k) for k in REPORT_SETTINGS},
                    "excluded": sorted(f"{e.model} fold {e.fold}" for e in r.excluded if e.symbol == symbol),
                    "reused": r.reused,
                    **{model: values for model, values in trained[run].items() if model in in_every_run},
                }
            )
            for run, r in present.items()
        }
        keys = sorted({k for s in settings.values() for k in s})
        differ = [k for k in keys if len({json.dumps(s.get(k), sort_keys=True, default=str) for s in settings.values()}) > 1]
        # a model some runs lack is one line, not each of its settings against nothing
        partly = sorted({model for models in trained.values() for model in models} - in_every_run)
        n_differ = len(differ) + len(partly)
        lines.append(f"  {n_differ} setting(s) differ" + (":" if n_differ else " (config, data and code are the same)"))
        for model in partly:
            lines.append(
                f"    {model}: checkpoints in {', '.join(run for run, models in trained.items() if model in models)} only"
            )
        for key in differ:
            values = "; ".join(f"{run}: {json.dumps(s.get(key), default=str)}" for run, s in settings.items())
            lines.append(f"    {key}: {values}"[:400])
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
