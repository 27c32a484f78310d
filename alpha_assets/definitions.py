"""The Definitions object `dg dev` / `dagster dev -w workspace.yaml` load."""

from __future__ import annotations

import os
import warnings

import dagster as dg

from alpha_assets.data_assets import bar_sidecars, book_sidecars, fold_plans
from alpha_assets.resources import default_resources
from alpha_assets.training_assets import checkpoint_assets, ensemble_report, hyperopt_assets

warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)

# Local multiprocess by default; MAX_PARALLEL (the spec's GPU concurrency cap) bounds the steps in flight.
MAX_PARALLEL = int(os.environ.get("MAX_PARALLEL", "10"))

defs = dg.Definitions(
    assets=[book_sidecars, bar_sidecars, fold_plans, *hyperopt_assets, *checkpoint_assets, ensemble_report],
    resources=default_resources(),
    executor=dg.multiprocess_executor.configured({"max_concurrent": MAX_PARALLEL}),
)
