"""The report's rows and equity curves as tables (CSV and Parquet), for a notebook or a spreadsheet: written with
the report, in its set (the JSON lists their checksums), so a table never describes another report."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the report module writes these tables: it imports this one, never the converse
    import polars as pl

    from alpha_core.eval.report import EnsembleReport

ROW_COLUMNS = (
    "n_sessions",
    "sharpe",
    "sharpe_se",
    "sharpe_ci_low",
    "sharpe_ci_high",
    "psr",
    "dsr",
    "dsr_n_trials",
    "max_drawdown",
    "turnover",
    "total_pnl",
    "win_rate",
    "hit_rate",
    "n_trades",
)


def rows(report: EnsembleReport) -> pl.DataFrame:
    """One row per symbol x report row (model or ensemble), out of sample, with the run it belongs to."""
    import polars as pl  # here, not at the top: every trainer imports the report's module, and polars costs 0.2 s

    records = []
    for symbol, sym in report.symbols.items():
        for kind, group in (("model", sym.models), ("ensemble", sym.ensembles)):
            for name, r in group.items():
                records.append(
                    {
                        "run_id": report.run_id,
                        "symbol": symbol,
                        "row": name,
                        "kind": kind,
                        "folds": ",".join(str(f.fold) for f in r.folds),
                        **{c: getattr(r.oos, c) for c in ROW_COLUMNS},
                    }
                )
    schema = {"run_id": pl.String, "symbol": pl.String, "row": pl.String, "kind": pl.String, "folds": pl.String}
    return pl.DataFrame(records, schema_overrides=schema, infer_schema_length=None) if records else pl.DataFrame(schema=schema)


def equity(report: EnsembleReport) -> pl.DataFrame:
    """Each row's cumulative PnL (ticks, net of cost) at the report's downsampled bar times (UTC)."""
    import polars as pl

    frames = [
        pl.DataFrame(
            {"symbol": symbol, "row": name, "ts": r.equity_ts, "equity": r.equity},
            schema={"symbol": pl.String, "row": pl.String, "ts": pl.Int64, "equity": pl.Float64},
        )
        for symbol, sym in report.symbols.items()
        for name, r in {**sym.models, **sym.ensembles}.items()
    ]
    schema = {"symbol": pl.String, "row": pl.String, "ts": pl.Int64, "equity": pl.Float64}
    table = pl.concat(frames) if frames else pl.DataFrame(schema=schema)
    return table.with_columns(pl.from_epoch("ts", time_unit="ns").dt.replace_time_zone("UTC").alias("time"))


def tables(report: EnsembleReport, stem: str) -> dict[str, bytes]:
    """`{stem}_rows.csv/.parquet` and `{stem}_equity.csv/.parquet`: file name -> bytes."""
    out = {}
    for name, frame in (("rows", rows(report)), ("equity", equity(report))):
        csv, parquet = io.BytesIO(), io.BytesIO()
        frame.write_csv(csv)
        frame.write_parquet(parquet)
        out[f"{stem}_{name}.csv"], out[f"{stem}_{name}.parquet"] = csv.getvalue(), parquet.getvalue()
    return out
