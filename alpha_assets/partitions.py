"""Partitions: one per symbol, and symbol x walk-forward fold for per-fold assets."""

from __future__ import annotations

import os

import dagster as dg

from alpha_core.data.products import PRODUCTS

SYMBOLS = [s.strip() for s in os.environ.get("ALPHA_SYMBOLS", ",".join(PRODUCTS)).split(",") if s.strip()]
N_FOLDS = int(os.environ.get("ALPHA_CV_N_FOLDS", "3"))

symbol_partitions = dg.StaticPartitionsDefinition(SYMBOLS)
fold_partitions = dg.StaticPartitionsDefinition([str(k) for k in range(N_FOLDS)])
symbol_fold_partitions = dg.MultiPartitionsDefinition({"symbol": symbol_partitions, "fold": fold_partitions})
