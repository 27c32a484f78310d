"""The Definitions object `dg dev`, `dagster dev -w workspace.yaml`, the code server and the daemon load.

The `dg` layout: everything under `alpha_assets/defs/` is loaded by `dg.load_from_defs_folder` (pyproject.toml's
`[tool.dg]`), plus the executor, chosen by the environment (local processes or Kubernetes pods).
"""

import warnings
from pathlib import Path

import dagster as dg

# MultiToSingleDimensionPartitionMapping and partitioned checks are Beta/Preview in 1.13; filter before defining
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)

from alpha_assets.execution import executor  # noqa: E402

defs = dg.Definitions.merge(
    dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
    dg.Definitions(executor=executor()),
)
