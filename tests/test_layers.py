"""The import graph of alpha_core: no cycle between modules, and no module imports a layer above its own (the
layers are documented in alpha_core/__init__.py). Imports under `if TYPE_CHECKING:` are annotations, not
dependencies, and are not counted; an import inside a function is."""

from __future__ import annotations

import ast
from pathlib import Path

import alpha_core

ROOT = Path(alpha_core.__file__).resolve().parent


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, known: set[str]) -> set[str]:
    """The alpha_core modules `path` imports at run time (a `from package import module` names the module)."""
    found = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("alpha_core"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("alpha_core"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(path, known) - {name} for name, path in mods.items()}


def layer_of(module: str) -> int:
    for index, (_, members) in enumerate(alpha_core.LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return index
    return 0  # a top-level module not named in a higher layer is foundation


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{a} ({alpha_core.LAYERS[layer_of(a)][0]}) imports {b} ({alpha_core.LAYERS[layer_of(b)][0]})"
        for a, targets in graph().items()
        for b in targets
        if a != "alpha_core" and b != "alpha_core" and layer_of(b) > layer_of(a)
    ]
    assert upward == []


def test_no_import_cycle():
    edges = {a: {b for b in bs if b != "alpha_core"} for a, bs in graph().items() if a != "alpha_core"}
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in edges:
        if v not in index:
            strong(v)
    assert cycles == []


def test_the_layers_name_real_modules():
    mods = set(modules())
    named = [m for _, members in alpha_core.LAYERS for m in members]
    assert all(any(x == m or x.startswith(m + ".") for x in mods) for m in named), named
