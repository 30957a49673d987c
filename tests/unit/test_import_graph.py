"""The modules of src/compbench import one another without a cycle (module-level and function-level
imports both: a lazy import inside a function is still an edge of the design)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (SRC / "compbench").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The project module `name` is (or lies in), None for a third-party one."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports. Importing a submodule runs its parent packages
    first; those edges (to an enclosing package) are Python's, not a design cycle, and are left out."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                # `from pkg import name`: the submodule pkg.name when there is one, else pkg itself.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                found = _resolve(target, mods)
                if found and found != module and not module.startswith(found + "."):
                    graph[module].add(found)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, colouring nodes)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_finder_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_function_level_imports_are_edges():
    graph = import_graph()
    # run_sweep's `from compbench.cli.run import train`
    assert "compbench.cli.run" in graph["compbench.cli.sweep"]
    assert "compbench.cli.main" not in graph["compbench.cli.sweep"]


def test_src_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


# The layers of src/compbench, bottom first: a module may import its own layer and those below it,
# never one above (a function-level import included). Every module lives in a package named for its
# job; only the package's own __init__ and __main__ stand at the top. A new package gets a place here;
# `test_every_module_has_a_layer` says when one is missing.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("base", "network")),
    ("devices", ("engines", "kernels")),
    ("records", ("records",)),
    ("codec", ("codec",)),
    ("compll", ("compll",)),
    ("catalog", ("catalog",)),
    ("components", ("compressors", "memory", "comm", "optim", "models", "data")),
    ("seam", ("seam",)),
    ("schedulers", ("schedulers",)),
    ("synchronizers", ("sync",)),
    ("launching", ("launch",)),
    ("trainer", ("train",)),
    ("composition", ("compose",)),
    ("commands", ("cli", "bench", "plan", "report", "race", "claims", "cluster", "__main__", "")),
]


def _unit(module: str) -> str:
    """The package (or top-level module) a module belongs to: compbench.seam.pipeline -> seam."""
    return module.split(".")[1] if "." in module else ""


def layer_of(module: str) -> int:
    unit = _unit(module)
    for i, (_, units) in enumerate(LAYERS):
        if unit in units:
            return i
    raise KeyError(f"{module}: its package {unit or 'compbench'} has no place in LAYERS")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
            for a in sorted(graph) for b in sorted(graph[a]) if layer_of(b) > layer_of(a)]


def test_the_layer_check_sees_an_upward_import():
    assert upward_imports({"compbench.kernels.cpu": {"compbench.train.loop"}}) == [
        "compbench.kernels.cpu (devices) imports compbench.train.loop (trainer)"]
    assert upward_imports({"compbench.train.loop": {"compbench.kernels.cpu"}}) == []


def test_every_module_has_a_layer():
    for module in import_graph():
        layer_of(module)


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    upward = upward_imports(import_graph())
    assert not upward, "\n".join(upward)


def test_no_two_packages_import_each_other():
    graph = import_graph()
    edges = {(_unit(a), _unit(b)) for a, targets in graph.items() for b in targets if _unit(a) != _unit(b)}
    pairs = sorted({tuple(sorted(e)) for e in edges if e[::-1] in edges})
    assert not pairs, pairs


def test_only_the_package_entry_points_stand_at_the_top():
    loose = sorted(p.name for p in (SRC / "compbench").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"], loose
