"""The data assets [symbol]: book and bar sidecars, fold plans."""

import dagster as dg

from alpha_assets.data_assets import bar_sidecars, book_sidecars, fold_plans


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=[book_sidecars, bar_sidecars, fold_plans])
