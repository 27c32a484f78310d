"""Raw data [quarter x symbol]: `raw_dbn` downloads one calendar quarter of a symbol from Databento, upstream of
the sidecars, with the same code and defaults as `alpha fetch` (`alpha_core.data.fetch`).

Backfill a symbol's history from the UI (the partitions of one symbol, any quarters); the `fetch_closed_quarter`
sensor (alpha_assets.defs.automation) fetches each quarter once it has closed. The files land under the data root
where the `new_dbn_files` sensor sees them, which rebuilds that symbol's sidecars and fold plans.
"""

import dagster as dg
from pydantic import Field

from alpha_assets import metadata
from alpha_assets.execution import CPU_POOL
from alpha_assets.partitions import split_symbol_quarter, symbol_quarter_partitions
from alpha_assets.pod_spec import FETCH_STEP_TAGS
from alpha_assets.resources import DataRoot
from alpha_core.data.fetch import FetchConfig, FetchSummary, fetch, next_quarter, quarter_name
from alpha_core.errors import FetchError

_DEFAULTS = FetchConfig.model_fields


class RawDbnConfig(dg.Config):
    """What a run may change; every default is `alpha fetch`'s (FetchConfig)."""

    max_cost: float = Field(_DEFAULTS["max_cost"].default, ge=0, description="USD: refuse a quarter that costs more")
    schemas: list[str] = Field(default_factory=_DEFAULTS["schemas"].default_factory)
    gateway: str = _DEFAULTS["gateway"].default
    batch_above_bytes: int = Field(_DEFAULTS["batch_above_bytes"].default, ge=0)
    poll_s: float = Field(_DEFAULTS["poll_s"].default, ge=0)
    job_timeout_s: float = Field(_DEFAULTS["job_timeout_s"].default, ge=0)
    max_attempts: int = Field(_DEFAULTS["max_attempts"].default, ge=1)
    backoff_s: float = Field(_DEFAULTS["backoff_s"].default, ge=0)
    max_backoff_s: float = Field(_DEFAULTS["max_backoff_s"].default, ge=0)


def _files_table(summary: FetchSummary) -> str:
    lines = ["| schema | from | to | status | route | USD | files |", "|---|---|---|---|---|---:|---|"]
    for u in summary.units:
        files = ", ".join(f.path for f in u.files) or "-"
        cost = "-" if u.cost_usd is None else f"{u.cost_usd:.2f}"
        lines.append(f"| {u.schema_} | {u.start} | {u.end} | {u.status} | {u.route or '-'} | {cost} | {files} |")
    return "\n".join(lines)


@dg.asset(
    partitions_def=symbol_quarter_partitions,
    group_name="data",
    kinds={"databento"},
    code_version="1",
    pool=CPU_POOL,
    op_tags=FETCH_STEP_TAGS,
    owners=metadata.OWNERS,
    metadata=metadata.code_references(("alpha_core.data.fetch", "fetch")),
    description="One calendar quarter of a parent symbol from Databento (MBP-10, OHLCV-1m, definitions), cost-bounded "
    "by max_cost; whole files only, resumable, nothing downloaded twice",
)
def raw_dbn(context: dg.AssetExecutionContext, config: RawDbnConfig, data: DataRoot) -> dg.MaterializeResult:
    symbol, start = split_symbol_quarter(context.partition_key)
    try:
        cfg = FetchConfig(symbol=symbol, start=start, end=next_quarter(start), data_dir=data.root, **config.model_dump())
        summary = fetch(cfg, log=context.log.info)
    except (FetchError, ValueError) as exc:  # one line (symbol, schema, range), never the key; a rerun resumes
        text = " ".join(str(exc).split())
        raise dg.Failure(description=f"{symbol} {quarter_name(start)}: {text}", allow_retries=False) from None
    return dg.MaterializeResult(
        metadata={
            "quarter": quarter_name(start),
            "cost_usd": metadata.text(round(summary.cost_usd, 2)),
            "billable_bytes": metadata.text(summary.billable_bytes),
            "fetched": metadata.text(sum(u.status == "fetched" for u in summary.units)),
            "files": dg.MetadataValue.json(summary.files()),
            "files_table": dg.MetadataValue.md(_files_table(summary)),
            "data_dir": dg.MetadataValue.path(str(data.root)),
        }
    )


(raw_dbn,) = dg.with_source_code_references([raw_dbn])


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=[raw_dbn])
