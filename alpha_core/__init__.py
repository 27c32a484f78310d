"""alpha_core: the pure library behind alpha (data, models, training, evaluation). Never imports dagster."""

from alpha_core import stages as _stages  # noqa: F401  (its import time starts the `imports` stage of a process)

__version__ = "0.1.0"
