"""The package's rooms and the one direction of its imports; old module paths still import.

Every import of the package is parsed, the lazy ones inside functions too: a module may import
its own room and the rooms below it (``ROOMS``, in the order data flows), never one above, and
no chain of imports may come back to where it started.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkbatch_dagster"

#: Bottom to top. A room may import the rooms before it; rooms on one line may not import each other.
ROOMS: list[set[str]] = [
    {"errors", "_moved"},  # _moved names the old paths as strings: it imports nothing of the package
    {"spec"},
    {"home"},
    {"inputs"},
    {"engines"},
    {"run"},
    {"estimate"},
    {"definitions"},
    {"cli", "testing"},
    {""},  # the package itself: its public names
]
RANK = {room: rank for rank, rooms in enumerate(ROOMS) for room in rooms}


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package: Path) -> dict[str, set[str]]:
    """Every module of ``package`` and the package modules it imports (at the top or lazily)."""
    names = {module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                # `from . import runner` imports a module; `from .spec import JobSpec`, a name of one.
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names}
        graph[name] = {m for m in found if m in names and m != name}
    return graph


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{src} imports {dst} ({room(dst) or 'the package'} is above {room(src) or 'the package'})"
                  for src, dsts in graph.items() for dst in dsts
                  if room(src) != room(dst) and RANK[room(dst)] >= RANK[room(src)])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import chains that come back to their start (one per cycle found by a depth-first walk)."""
    found, state = [], {}

    def walk(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            walk(start, [start])
    return found


def test_every_module_is_in_a_room_with_a_docstring_saying_what_it_owns():
    graph = imports(PACKAGE)
    assert {room(m) for m in graph} <= set(RANK), "a room that ROOMS does not place: add it to ROOMS"
    for name in {room(m) for m in graph} - {"", "errors", "testing", "_moved"}:
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text())) or ""
        assert "May import" in doc, f"{name}/__init__.py: say what the room owns and what it may import"


def test_imports_go_one_way_and_never_in_a_circle():
    graph = imports(PACKAGE)
    assert sum(len(v) for v in graph.values()) > 150  # the parse sees the package's imports, lazy ones too
    assert upward(graph) == []
    assert cycles(graph) == []


def _plant(tmp_path: Path, module: str, line: str) -> dict[str, set[str]]:
    """The package's import graph with ``line`` added inside a function of ``module``."""
    import shutil

    copy = tmp_path / "sparkbatch_dagster"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + f"\n\ndef _planted():\n    {line}\n")
    return imports(copy)


def test_a_planted_upward_import_fails_the_check(tmp_path):
    graph = _plant(tmp_path, "run/runner.py", "from ..definitions.resource import VLLMResource")
    assert upward(graph) == ["sparkbatch_dagster.run.runner imports sparkbatch_dagster.definitions.resource "
                             "(definitions is above run)"]


def test_a_planted_cycle_inside_a_room_fails_the_check(tmp_path):
    # checkpoint imports home; runner imports checkpoint: checkpoint importing runner closes a circle.
    graph = _plant(tmp_path, "run/checkpoint.py", "from . import runner")
    assert upward(graph) == []
    assert any({"sparkbatch_dagster.run.runner", "sparkbatch_dagster.run.checkpoint"} <= set(c)
               for c in cycles(graph))


def test_importing_the_package_from_inside_it_is_upward(tmp_path):
    graph = _plant(tmp_path, "engines/start.py", "from sparkbatch_dagster import JobSpec")
    assert upward(graph) == ["sparkbatch_dagster.engines.start imports sparkbatch_dagster "
                             "(the package is above engines)"]


OLD = {
    "sparkbatch_dagster.store": ("sparkbatch_dagster.home", "JobHome"),
    "sparkbatch_dagster.results": ("sparkbatch_dagster.run.result_store", "ResultStore"),
    "sparkbatch_dagster.resources": ("sparkbatch_dagster.definitions.resource", "VLLMResource"),
    "sparkbatch_dagster.assets": ("sparkbatch_dagster.definitions.factory", "build_batch_assets"),
    "sparkbatch_dagster.deploy": ("sparkbatch_dagster.definitions.deploy", "k8s_gpu_tags"),
    "sparkbatch_dagster.engine_start": ("sparkbatch_dagster.engines.start", "start"),
    "sparkbatch_dagster.shards": ("sparkbatch_dagster.inputs.shards", "build_shards"),
    "sparkbatch_dagster.runner": ("sparkbatch_dagster.run.runner", "parse_output"),
}


@pytest.mark.parametrize("old", sorted(OLD))
def test_an_old_module_path_is_the_new_module_with_a_warning_naming_it(old):
    new, name = OLD[old]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new) and hasattr(module, name)
    assert any(f"moved to {new}" in str(w.message) for w in caught)
