"""Hyperparameter search: particle swarm optimisation through nevergrad."""
