"""The package's rooms, the modules each room's docstring names, and the one direction of its imports.

Every import of the package is parsed, the lazy ones inside functions too: a module may import
its own room and the rooms below it (``ROOMS``, in the order data flows), never one above, and
no chain of imports may come back to where it started.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkbatch_dagster"

#: Bottom to top. A room may import the rooms before it; rooms on one line may not import each other.
ROOMS: list[set[str]] = [
    {"errors"},
    {"spec"},
    {"home"},
    {"inputs"},
    {"engines"},
    {"run"},
    {"estimate"},
    {"definitions"},
    {"serve", "review"},  # the services: the Batch API over HTTP; the review round trip through Label Studio
    {"cli", "testing"},
    {""},  # the package itself: its public names
]
RANK = {room: rank for rank, rooms in enumerate(ROOMS) for room in rooms}

#: Inside ``engines/``, bottom to top, the same way: its sub-packages by name, its top-level modules
#: by module name ("" is ``engines/__init__``), the base's modules as one. A backend (fake, offline,
#: server) never imports another.
ENGINE_ROOMS: list[set[str]] = [
    {"platform"},  # the machine: memory, CPU, processes, model files, compile cache; no engine
    {"base"},  # base.py, config.py, settings.py, gpu_lock.py: interface, requests, results, settings, locks
    {"answers"},  # what an answer is made of, for any backend: labels, confidence, reasoning, sampling
    {"fake", "offline", "server"},  # the backends
    {"start", ""},  # which backend starts, and the package's names
]
BASE_MODULES = {"base", "config", "settings", "gpu_lock"}
ENGINE_RANK = {room: rank for rank, rooms in enumerate(ENGINE_ROOMS) for room in rooms}


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


def engine_room(module: str) -> str:
    """The sub-room of an ``engines`` module: its sub-package, or its own name at the top level."""
    parts = module.split(".")
    name = parts[2] if len(parts) > 2 else ""
    return "base" if name in BASE_MODULES else name


def upward(graph: dict[str, set[str]]) -> list[str]:
    between_rooms = [f"{src} imports {dst} ({room(dst) or 'the package'} is above {room(src) or 'the package'})"
                     for src, dsts in graph.items() for dst in dsts
                     if room(src) != room(dst) and RANK[room(dst)] >= RANK[room(src)]]
    in_engines = [f"{src} imports {dst} (engines/{engine_room(dst)} is not below engines/{engine_room(src)})"
                  for src, dsts in graph.items() for dst in dsts
                  if room(src) == room(dst) == "engines" and engine_room(src) != engine_room(dst)
                  and ENGINE_RANK[engine_room(dst)] >= ENGINE_RANK[engine_room(src)]]
    return sorted(between_rooms + in_engines)


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
    for name in {room(m) for m in graph} - {"", "errors", "testing"}:
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text())) or ""
        assert "May import" in doc, f"{name}/__init__.py: say what the room owns and what it may import"


def named_modules(package_dir: Path) -> set[str]:
    """The modules an ``__init__`` docstring names, as ``:mod:`.name``` (``..name`` is another folder's)."""
    doc = ast.get_docstring(ast.parse((package_dir / "__init__.py").read_text())) or ""
    return set(re.findall(r":mod:`\.(\w+)", doc))


def modules_on_disk(package_dir: Path) -> set[str]:
    """A folder's modules (``__init__`` aside) and its sub-packages, by name."""
    return ({p.stem for p in package_dir.glob("*.py") if p.name != "__init__.py"}
            | {p.parent.name for p in package_dir.glob("*/__init__.py")})


def docstring_gaps(package: Path) -> list[str]:
    """Every room and sub-package whose ``__init__`` docstring leaves out one of its modules, or
    names one that is not there."""
    gaps = []
    for init in sorted(package.rglob("__init__.py")):
        here, where = init.parent, init.parent.relative_to(package.parent).as_posix()
        if here == package:
            continue  # the package's own docstring names the rooms, in order
        named, found = named_modules(here), modules_on_disk(here)
        gaps += [f"{where}/__init__.py does not name :mod:`.{m}`" for m in sorted(found - named)]
        gaps += [f"{where}/__init__.py names :mod:`.{m}`, which is not in {where}/" for m in sorted(named - found)]
    return gaps


def test_every_room_docstring_names_each_of_its_modules_and_no_other():
    assert docstring_gaps(PACKAGE) == []


def test_a_module_left_out_of_its_room_docstring_or_gone_from_disk_fails_the_check(tmp_path):
    import shutil

    copy = tmp_path / "sparkbatch_dagster"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "run" / "planted.py").write_text('"""Planted."""\n')
    (copy / "engines" / "server" / "handoff.py").unlink()
    already = set(docstring_gaps(PACKAGE))  # the check above reports those
    assert [gap for gap in docstring_gaps(copy) if gap not in already] == [
        "sparkbatch_dagster/engines/server/__init__.py names :mod:`.handoff`, which is not in "
        "sparkbatch_dagster/engines/server/",
        "sparkbatch_dagster/run/__init__.py does not name :mod:`.planted`"]


def test_imports_go_one_way_and_never_in_a_circle():
    graph = imports(PACKAGE)
    assert {engine_room(m) for m in graph if room(m) == "engines"} <= set(ENGINE_RANK), \
        "an engines sub-room that ENGINE_ROOMS does not place: add it there"
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


def test_a_planted_import_between_engine_sub_rooms_fails_the_check(tmp_path):
    graph = _plant(tmp_path, "engines/offline/vllm_offline.py", "from ..server.endpoints import configured_urls")
    assert upward(graph) == ["sparkbatch_dagster.engines.offline.vllm_offline imports sparkbatch_dagster."
                             "engines.server.endpoints (engines/server is not below engines/offline)"]
    graph = _plant(tmp_path / "2", "engines/platform/memory.py", "from ..base import Engine")
    assert upward(graph) == ["sparkbatch_dagster.engines.platform.memory imports "
                             "sparkbatch_dagster.engines.base (engines/base is not below engines/platform)"]


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



def test_the_services_never_import_the_command_line_or_each_other(tmp_path):
    graph = _plant(tmp_path, "serve/app.py", "from ..cli.console import emit")
    assert upward(graph) == ["sparkbatch_dagster.serve.app imports sparkbatch_dagster.cli.console (cli is above serve)"]
    graph = _plant(tmp_path / "2", "review/queue.py", "from ..serve.store import Store")
    assert upward(graph) == ["sparkbatch_dagster.review.queue imports sparkbatch_dagster.serve.store "
                             "(serve is above review)"]
