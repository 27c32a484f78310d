"""Each model file's `Hooks:` line names exactly the optional hooks (alpha_core/models/hooks.py) its model has, so
a reader of the file sees what the trainers and the predictor will call on it."""

from __future__ import annotations

import importlib
import re

import pytest

from alpha_core.models import hooks, registry

OPTIONAL = (hooks.OwnLoss, hooks.Sampling, hooks.LastPosition, hooks.PositionWise, hooks.CpuBatch)
BAR_MODELS = [s for s in registry.REGISTRY.values() if s.trainer == "supervised"]


def declared(module: str) -> set[str]:
    doc = importlib.import_module(module).__doc__ or ""
    line = re.search(r"^Hooks \(alpha_core/models/hooks\.py\): (.*)$", doc, re.M)
    assert line, f"{module}: no `Hooks (alpha_core/models/hooks.py): ...` line in its docstring"
    return {p.__name__ for p in OPTIONAL if re.search(rf"\b{p.__name__}\b", line.group(1))}


@pytest.mark.parametrize("spec", BAR_MODELS, ids=lambda s: s.name)
def test_hooks_line_names_the_hooks_the_model_has(spec):
    model = spec.build(n_features=4)
    assert declared(spec.module) == {p.__name__ for p in OPTIONAL if isinstance(model, p)}
