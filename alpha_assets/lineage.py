"""Which asset partitions a request covers, shared by `alpha run` (`alpha_assets.run`) and the retrain sensors.

- `PHASES`: what `alpha run --phase` accepts; `DATA_ASSETS`: the assets every phase includes.
- `lineage(symbols, models, phase)`: the targets of a phase, asset key -> partition keys: the data assets
  [symbol], then hyperopt [symbol], every fold's checkpoints [symbol x fold] and the report [symbol] as the phase
  asks.
- `asset_graph_subset(targets, asset_graph)`: those targets as the AssetGraphSubset a backfill (or a sensor's
  backfill request) is made of.
"""

from __future__ import annotations

import dagster as dg

from alpha_assets.dagster_private import make_asset_graph_subset
from alpha_assets.partitions import symbol_fold_keys
from alpha_core.models import registry

PHASES = ("hyperopt", "train", "eval", "full")
DATA_ASSETS = ("book_sidecars", "bar_sidecars", "fold_plans")


def lineage(symbols: list[str], models: list[str], phase: str) -> dict[str, list[str]]:
    """The asset partitions of a phase: data always, then hyperopt, checkpoints and the report as the phase asks."""
    targets = {asset: list(symbols) for asset in DATA_ASSETS}
    if phase in ("hyperopt", "full"):
        targets |= {f"hyperopt/{m}": list(symbols) for m in models if registry.get(m).search_space is not None}
    if phase in ("train", "full"):
        folds = [key for symbol in symbols for key in symbol_fold_keys(symbol)]
        targets |= {f"checkpoints/{m}": folds for m in models}
    if phase in ("eval", "full"):
        targets["ensemble_report"] = list(symbols)
    return targets


def asset_graph_subset(targets: dict[str, list[str]], asset_graph):
    """The targets as the AssetGraphSubset a backfill (or a sensor's backfill request) is made of."""
    subsets = {}
    for asset, keys in targets.items():
        key = dg.AssetKey.from_user_string(asset)
        subsets[key] = asset_graph.get(key).partitions_def.subset_with_partition_keys(keys)
    return make_asset_graph_subset(subsets)
