"""The layer table of docs/ARCHITECTURE.md, enforced: every import in `baton/` (function-local
ones too, read with `ast`, so a lazy import cannot hide an upward dependency) points to
the module's own package or to a lower layer; no two modules import each other, even
through others; only `baton/controller/ray_backend.py` imports ray."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "baton"

# Top to bottom. A module may import its own package (same first component) or any package
# of a LOWER layer; never a package of its own layer or of a higher one.
LAYERS = [
    {"cli", "__init__", "python_api"},  # `baton` itself: the public names (resolved lazily), the CLI, baton.train
    {"cli_help"},  # the CLI's key listings and `baton config`
    {"trainers"},
    # where a step's rows come from: the drivers and their configs ask it; it drives the roles
    # (rollout, generator, server sync), the agents and the trajectory API's client
    {"sources"},
    {"workers"},
    {"agents"},  # multi-turn episodes with tools, run next to an engine
    {"services", "tinker"},  # processes that talk to engines over HTTP (trajectory API, environment runners);
    # the Tinker API server over its own training models and the embedded engine
    {"rollout"},
    {"envs"},
    {"sync", "rewards", "models", "data", "algos", "controller"},
    {"rows"},  # the training row (`Trajectory`) and the one `to_batch` every source pads with
    {"batch", "metrics", "config"},
    {"metric_sinks"},  # TensorBoard, wandb, MLflow: classes in a registry
    {"fields", "protocol", "runs", "registry", "padding", "user_modules", "http"},
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def unit(module: str) -> str:
    """The layer unit of a module: `baton.workers.actor` -> workers, `baton` -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(module: str) -> set[str]:
    """Every baton module `module` imports, anywhere in its body."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "baton")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "baton":
                continue
            for alias in node.names:  # `from baton import fields` imports the module baton.fields
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m != module}


@functools.cache
def graph() -> dict[str, set[str]]:
    """Every module's baton imports (parsed when a test first asks: not at collection, which
    every xdist worker does)."""
    return {m: imports_of(m) for m in MODULES}


def test_every_package_has_a_layer():
    missing = sorted({unit(m) for m in MODULES} - set(LEVEL))
    assert not missing, f"add {missing} to LAYERS here and to the table in docs/ARCHITECTURE.md"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    mine = unit(module)
    upward = sorted(t for t in graph()[module] if unit(t) != mine and LEVEL[unit(t)] <= LEVEL[mine])
    assert not upward, (f"{module} (layer {mine!r}) imports {upward}: a module may import only its own "
                        f"package or a lower layer (see docs/ARCHITECTURE.md)")


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph().get(m, ())):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t in graph() and t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph()):
        if m not in state:
            visit(m)


def test_only_the_ray_backend_imports_ray():
    users = set()
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "ray" or n.startswith("ray.") for n in names):
                users.add(module)
    assert users <= {"baton.controller.ray_backend"}, sorted(users)
