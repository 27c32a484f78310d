"""Partitions: one per symbol, and symbol x walk-forward fold for per-fold assets.

Fixed in code, never read from the environment: the webserver, the daemon, the code server and every step pod
must see the same asset graph. Keys read symbol first (`ES.FUT|2`: Dagster joins the dimensions in name order, and
`symbol` sorts before `wf_fold`). Build and parse them only with `symbol_fold_key` and `split_symbol_fold`.
"""

from __future__ import annotations

import dagster as dg

from alpha_core.data.folds import N_FOLDS
from alpha_core.data.products import PRODUCTS
from alpha_core.errors import PlanError

SYMBOLS = list(PRODUCTS)
SYMBOL_DIM, FOLD_DIM = "symbol", "wf_fold"

symbol_partitions = dg.StaticPartitionsDefinition(SYMBOLS)
fold_partitions = dg.StaticPartitionsDefinition([str(k) for k in range(N_FOLDS)])
symbol_fold_partitions = dg.MultiPartitionsDefinition({SYMBOL_DIM: symbol_partitions, FOLD_DIM: fold_partitions})


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
