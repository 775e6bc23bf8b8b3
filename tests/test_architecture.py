"""The dependency rule (docs/architecture.md), checked on the source: no import cycles among
pgrag's modules (function-level imports included: they hide cycles, they do not remove them),
and every import goes down the layers, never up.

    foundation  errors, config, limits
    io          connection, server
    core        documents, migrate, filters, search, embed.*, worker, ask, parse, answer, ...
    client      db (Client, AsyncClient), the package's facade
    lab         pgrag.lab.*: sample shop, demo, eval, sweeps, synthetic stores
    cli         pgrag.cli*: the command line

The core never imports the lab or the CLI; the lab never imports the CLI.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "pgrag"
LAYERS = ["foundation", "io", "core", "client", "lab", "cli"]
FOUNDATION = {"pgrag.errors", "pgrag.config", "pgrag.limits"}
IO = {"pgrag.connection", "pgrag.server", "pgrag.replicas"}
CLIENT = {"pgrag.db", "pgrag"}


def module_names() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = module_names()


def layer(module: str) -> str:
    if module in FOUNDATION:
        return "foundation"
    if module in IO:
        return "io"
    if module in CLIENT:
        return "client"
    if module.startswith("pgrag.lab"):
        return "lab"
    if module.startswith("pgrag.cli") or module == "pgrag.__main__":
        return "cli"
    return "core"


def imports(module: str) -> set[str]:
    """pgrag modules ``module`` imports, anywhere in its body (under TYPE_CHECKING excepted:
    annotations are not dependencies at run time)."""
    tree = ast.parse(MODULES[module].read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
            targets = [n for n in names if n in MODULES] or [node.module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            while t not in MODULES and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in MODULES and t != module and t.startswith("pgrag"):
                found.add(t)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_no_module_imports_itself_back() -> None:
    cycles = []
    for start in GRAPH:
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, path = stack.pop()
            for nxt in GRAPH[node]:
                if nxt == start:
                    cycles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert cycles == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module: str) -> None:
    up = sorted(t for t in GRAPH[module] if LAYERS.index(layer(t)) > LAYERS.index(layer(module)))
    # the package facade (pgrag) loads its client and errors; lazy attributes are by name
    assert up == [], f"{module} ({layer(module)}) imports {up}"
