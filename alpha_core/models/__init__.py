"""Sequence models of alpha (CfC, Mamba2, heads); pure PyTorch, no dagster."""
