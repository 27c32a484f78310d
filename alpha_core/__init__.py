"""alpha_core: the pure library behind alpha (data, models, training, evaluation). Never imports dagster.

Its layers, lowest first; a module imports only from its own layer or lower ones (tests/test_layers.py):

- foundation: every module directly in alpha_core/ but the doors: errors, bounds, atomic writes, locks and
  attempts, devices, CPU budgets, progress, PnL and Sharpe arithmetic (`metrics`), params files and search records
  (`params`), the CME session calendar (`sessions`), and one module per third-party library's private API.
- data: DBN decoding, validation, features, labels, sidecars, fold plans, the demo generator.
- models: the flagship and the ten members, their kernels and the registry.
- rl: the trading environment and the SB3 agents.
- eval: predictions, the decision clock, validation scores, the report.
- train: the trainers (they score their validation with eval's functions).
- hyperopt: the PSO search (it trains trials).
- doors: the CLI, and the step settings alpha run checks.
"""

from alpha_core import stages as _stages  # noqa: F401  (its import time starts a process's `imports` stage)

__version__ = "0.1.0"

LAYERS = (
    ("foundation", ()),  # every top-level module not named in a higher layer
    ("data", ("alpha_core.data",)),
    ("models", ("alpha_core.models",)),
    ("rl", ("alpha_core.rl",)),
    ("eval", ("alpha_core.eval",)),
    ("train", ("alpha_core.train",)),
    ("hyperopt", ("alpha_core.hyperopt",)),
    ("doors", ("alpha_core.cli", "alpha_core.step_settings")),
)
