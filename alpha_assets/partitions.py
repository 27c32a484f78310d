"""Partitions: one per symbol, symbol x walk-forward fold for per-fold assets, and quarter x symbol for raw data.

Fixed in code, never read from the environment: the webserver, the daemon, the code server and every step pod
must see the same asset graph. Keys read symbol first (`ES.FUT|2`: Dagster joins the dimensions in name order, and
`symbol` sorts before `wf_fold`). Build and parse them only with `symbol_fold_key` and `split_symbol_fold`.

Raw DBN downloads (`raw_dbn`) are per calendar quarter (UTC) and symbol: `2024-01-01|ES.FUT` (`quarter` sorts
before `symbol`). The quarters are a time window from GLBX.MDP3's first whole quarter, so a quarter's partition
exists once it has closed; build and parse the keys with `symbol_quarter_key` and `split_symbol_quarter`.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from alpha_core.data.folds import N_FOLDS
from alpha_core.data.products import PRODUCTS
from alpha_core.errors import PlanError

SYMBOLS = list(PRODUCTS)
SYMBOL_DIM, FOLD_DIM, QUARTER_DIM = "symbol", "wf_fold", "quarter"
FIRST_QUARTER = "2010-07-01"  # GLBX.MDP3 starts on 2010-06-06

symbol_partitions = dg.StaticPartitionsDefinition(SYMBOLS)
fold_partitions = dg.StaticPartitionsDefinition([str(k) for k in range(N_FOLDS)])
symbol_fold_partitions = dg.MultiPartitionsDefinition({SYMBOL_DIM: symbol_partitions, FOLD_DIM: fold_partitions})
quarter_partitions = dg.TimeWindowPartitionsDefinition(
    cron_schedule="0 0 1 1,4,7,10 *", start=FIRST_QUARTER, fmt="%Y-%m-%d", timezone="UTC"
)
symbol_quarter_partitions = dg.MultiPartitionsDefinition({QUARTER_DIM: quarter_partitions, SYMBOL_DIM: symbol_partitions})


def symbol_fold_key(symbol: str, fold: int) -> str:
    """`ES.FUT|2`, as a MultiPartitionKey (a str that Dagster also reads per dimension)."""
    key = dg.MultiPartitionKey({SYMBOL_DIM: symbol, FOLD_DIM: str(fold)})
    if symbol not in SYMBOLS or not 0 <= fold < N_FOLDS:
        raise PlanError(f"no symbol x fold partition {key!r} (symbols {', '.join(SYMBOLS)}; folds 0-{N_FOLDS - 1})")
    return key


def split_symbol_fold(key: str) -> tuple[str, int]:
    """`ES.FUT|2` -> ("ES.FUT", 2)."""
    symbol, sep, fold = str(key).partition("|")
    if not sep or not fold.isdigit():
        raise PlanError(f"{key!r} is not a symbol x fold partition key (e.g. ES.FUT|0)")
    symbol_fold_key(symbol, int(fold))  # validates both parts
    return symbol, int(fold)


def symbol_fold_keys(symbol: str) -> list[str]:
    """Every fold partition of one symbol, in fold order."""
    return [symbol_fold_key(symbol, fold) for fold in range(N_FOLDS)]


def symbol_quarter_key(symbol: str, quarter: dt.date | str) -> str:
    """`2024-01-01|ES.FUT`: the quarter starting on that date, of that symbol."""
    start = quarter if isinstance(quarter, str) else quarter.isoformat()
    if symbol not in SYMBOLS or start not in quarter_partitions.get_partition_keys():
        raise PlanError(
            f"no quarter x symbol partition {start}|{symbol} (symbols {', '.join(SYMBOLS)}; closed quarters from "
            f"{FIRST_QUARTER}, each starting on Jan/Apr/Jul/Oct 1)"
        )
    return dg.MultiPartitionKey({QUARTER_DIM: start, SYMBOL_DIM: symbol})


def split_symbol_quarter(key: str) -> tuple[str, dt.date]:
    """`2024-01-01|ES.FUT` -> ("ES.FUT", date(2024, 1, 1))."""
    quarter, sep, symbol = str(key).partition("|")
    if not sep:
        raise PlanError(f"{key!r} is not a quarter x symbol partition key (e.g. 2024-01-01|ES.FUT)")
    symbol_quarter_key(symbol, quarter)
    return symbol, dt.date.fromisoformat(quarter)
