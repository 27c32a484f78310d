"""The training lineage: hyperopt [symbol], checkpoints [symbol x fold], the report [symbol] and the run summary."""

import dagster as dg

from alpha_assets.training_assets import checkpoint_assets, ensemble_report, hyperopt_assets, run_summary


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(assets=[*hyperopt_assets, *checkpoint_assets, ensemble_report, run_summary])
