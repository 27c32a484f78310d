"""Sequence models of alpha: the flagship, the supervised members, their kernels, the registry and the model
protocol (`hooks`). No dagster."""
