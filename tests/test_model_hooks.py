"""Each model file's `Hooks:` line names exactly the optional hooks (alpha_core/models/hooks.py) its model has, so
a reader of the file sees what the trainers and the predictor will call on it."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

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


def _shape_note(lines: list[str], fn: ast.FunctionDef) -> str:
    """The text a reader sees first for a forward: its def line's comment, its docstring, the comments before
    its first statement."""
    doc = ast.get_docstring(fn) or ""
    first = fn.body[1] if doc and len(fn.body) > 1 else fn.body[0]
    head = lines[fn.lineno - 1 : first.lineno]
    return doc + "\n" + "\n".join(line.split("#", 1)[1] for line in head if "#" in line)


def test_every_forward_states_its_shapes():
    """Each forward of alpha_core/models names its input and output shapes (`x [B, K, F] -> [B, K, H]`)."""
    missing = []
    for path in sorted(Path(registry.__file__).parent.glob("*.py")):
        lines = path.read_text().splitlines()
        classes = [node for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)]
        forwards = [(c, f) for c in classes for f in c.body if isinstance(f, ast.FunctionDef) and f.name.startswith("forward")]
        missing += [
            f"{path.name}:{fn.lineno} {cls.name}.{fn.name}"
            for cls, fn in forwards
            if not re.search(r"\[[^\]]*\].*->.*\[", _shape_note(lines, fn))
        ]
    assert not missing, missing
