"""The Definitions object `dg dev` / `dagster dev -w workspace.yaml` load."""

import warnings

import dagster as dg

# MultiToSingleDimensionPartitionMapping and partitioned checks are Beta/Preview in 1.13; filter before defining
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)

from alpha_assets.automation import jobs, new_dbn_files, schedules  # noqa: E402
from alpha_assets.data_assets import bar_sidecars, book_sidecars, fold_plans  # noqa: E402
from alpha_assets.execution import executor  # noqa: E402
from alpha_assets.resources import default_resources  # noqa: E402
from alpha_assets.training_assets import (  # noqa: E402
    checkpoint_assets,
    ensemble_report,
    hyperopt_assets,
    run_summary,
)

defs = dg.Definitions(
    assets=[book_sidecars, bar_sidecars, fold_plans, *hyperopt_assets, *checkpoint_assets, ensemble_report, run_summary],
    jobs=jobs,
    schedules=schedules,
    sensors=[new_dbn_files],
    resources=default_resources(),
    executor=executor(),
)
