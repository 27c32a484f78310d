"""alpha_core: the pure library behind alpha (data, models, training, evaluation). Never imports dagster."""

__version__ = "0.1.0"
