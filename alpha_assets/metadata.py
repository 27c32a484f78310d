"""How alpha's numbers show in the Dagster UI: metrics Dagster can plot, text for the rest, tables and inline plots.

Dagster plots every Int/Float entry of a partitioned asset as ONE line across its partitions (x = partition key,
or x = time over all partitions' events), so a plain `val_auc_h10` would join ES.FUT fold 0 to fold 1 to NQ.FUT
fold 0, which are unrelated models. Only metrics are numbers here, each keyed by its partition (`series`): one
series per symbol x fold (or symbol), which the "Events" view draws over retrains. Counts, durations and
thresholds are text (`text`), so they are shown but never plotted. Numbers are rounded to 4 decimals; None and NaN
are left out rather than shown as strings.
"""

from __future__ import annotations

import ast
import base64
import importlib.util
import math
from pathlib import Path

import dagster as dg

from alpha_core.metrics import drawdown

OWNERS = ["team:quant-research"]  # who answers for every asset of the lineage (checks have no owners in 1.13)


def number(value: float | int | None, digits: int = 4) -> float | int | None:
    """A finite number rounded for display, None otherwise (the caller leaves it out)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    value = float(value)
    return round(value, digits) if math.isfinite(value) else None


def clean(metadata: dict) -> dict:
    """Round plain numbers and drop entries without a value (no "None" or "nan" strings in the UI)."""
    out = {}
    for key, value in metadata.items():
        if isinstance(value, float | int) and not isinstance(value, bool):
            value = number(value)
        if value is not None:
            out[key] = value
    return out


def per_horizon(prefix: str, horizons: list[int], values: list[float]) -> dict[str, float]:
    """`val_auc_h10`, `val_auc_h100`, ...: one plottable number per horizon."""
    return {f"{prefix}_h{h}": v for h, v in zip(horizons, values, strict=True)}


def table(rows: list[dict]) -> dg.MetadataValue:
    """A Dagster table from rows of plain values (column types from the first row)."""
    if not rows:
        return dg.MetadataValue.md("(no rows)")
    columns = [
        dg.TableColumn(name, "float" if isinstance(v, float) else "int" if isinstance(v, int) else "string")
        for name, v in rows[0].items()
    ]
    records = [dg.TableRecord({k: (number(v) if isinstance(v, float) else v) for k, v in row.items()}) for row in rows]
    return dg.MetadataValue.table(records=records, schema=dg.TableSchema(columns=columns))


def inline_png(path: Path, title: str) -> dg.MetadataValue:
    """A PNG file embedded in Markdown, so the asset page shows the plot itself rather than a path."""
    return png(Path(path).read_bytes(), title)


def series(metric: str, partition: str, run: str | None = None) -> str:
    """The metadata key of one metric of one partition, and of one run where given: `val_auc_h10 [ES.FUT fold 1,
    run demo]`, `best_score [ES.FUT, run demo]`. Dagster plots a key's values across a partition's materializations
    as one line: keyed by run, two runs of a fold never join into one line."""
    symbol, sep, fold = str(partition).partition("|")
    where = f"{symbol} fold {fold}" if sep else symbol
    return f"{metric} [{where}{f', run {run}' if run else ''}]"


def text(value: float | int | str | None, digits: int = 4) -> dg.MetadataValue | None:
    """A value shown but never plotted (a count, a duration, a threshold)."""
    if isinstance(value, float):
        value = number(value, digits)
    return None if value is None else dg.MetadataValue.text(str(value))


def png(data: bytes, title: str) -> dg.MetadataValue:
    """PNG bytes embedded in Markdown (Dagster 1.13 shows Markdown over 1,000 characters one click away)."""
    return dg.MetadataValue.md(f"**{title}**\n\n![{title}](data:image/png;base64,{base64.b64encode(data).decode()})")


INLINE_MARKDOWN = 1000  # Dagster 1.13 shows Markdown up to this many characters in place, longer one click away


def sparkline(equity: list[float], name: str, points: int = 30) -> dg.MetadataValue | None:
    """An equity curve (green) over its drawdown (red) as a tiny SVG in Markdown short enough for Dagster to show in
    place on the asset's page, beside the full plot one click away. None when there is nothing to draw."""
    values = [float(v) for v in equity if math.isfinite(v)]
    if len(values) < 2:
        return None
    below_peak = drawdown(values).tolist()  # as the report's drawdown panel draws it
    picks = [round(i * (len(values) - 1) / (points - 1)) for i in range(points)] if len(values) > points else range(len(values))
    step = 478 / (len(picks) - 1)

    def line(ys: list[float], top: int, height: int) -> str:
        lo, span = min(ys), (max(ys) - min(ys)) or 1.0
        return " ".join(f"{i * step:.0f},{top + height - (ys[k] - lo) / span * height:.0f}" for i, k in enumerate(picks))

    svg = (
        "<svg xmlns='http://www.w3.org/2000/svg' width='480' height='84'><g fill='none' stroke-width='1.5'>"
        f"<polyline stroke='#2a7' points='{line(values, 2, 50)}'/>"
        f"<polyline stroke='#c33' points='{line(below_peak, 58, 24)}'/></g></svg>"
    )
    text = (
        f"{name}: equity (green) and drawdown (red), ticks net of cost\n\n"
        f"![equity](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})"
    )
    return dg.MetadataValue.md(text) if len(text) <= INLINE_MARKDOWN else None


def code_references(*targets: tuple[str, str]) -> dict[str, dg.CodeReferencesMetadataValue]:
    """`dagster/code_references` to functions of alpha_core, given as (module, function), found without importing
    the module (a trainer imports torch; the definitions must load fast). The asset's own function is added by
    `dg.with_source_code_references`."""
    references = []
    for module, function in targets:
        path = importlib.util.find_spec(module).origin
        tree = ast.parse(Path(path).read_text())
        line = next(n.lineno for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == function)
        references.append(dg.LocalFileCodeReference(file_path=path, line_number=line, label=f"{module}.{function}"))
    return {"dagster/code_references": dg.CodeReferencesMetadataValue(code_references=references)}
