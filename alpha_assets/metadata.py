"""How alpha's numbers show in the Dagster UI: rounded numbers that Dagster can plot, tables and inline plots.

Every scalar goes in as a plain number (so the asset page plots it across materializations), rounded to 4
significant decimals; None and NaN are left out rather than shown as strings.
"""

from __future__ import annotations

import base64
import math
from pathlib import Path

import dagster as dg


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
    columns = [dg.TableColumn(name, "float" if isinstance(v, float) else "int" if isinstance(v, int) else "string")
               for name, v in rows[0].items()]
    records = [dg.TableRecord({k: (number(v) if isinstance(v, float) else v) for k, v in row.items()}) for row in rows]
    return dg.MetadataValue.table(records=records, schema=dg.TableSchema(columns=columns))


def inline_png(path: Path, title: str) -> dg.MetadataValue:
    """A PNG embedded in Markdown, so the asset page shows the plot itself rather than a path."""
    encoded = base64.b64encode(Path(path).read_bytes()).decode()
    return dg.MetadataValue.md(f"**{title}**\n\n![{title}](data:image/png;base64,{encoded})")
