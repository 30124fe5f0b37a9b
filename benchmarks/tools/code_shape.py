"""The shape of the package's code, as issue 50's note reports it before and after: the modules
and import arrows inside ``engines/``, the files one engine option is named in, the functions
that return ``dict[str, Any]``, the longest ``generate``, the ``["cost_usd"]`` indexes, and the
module count with the largest module's lines.

    python -m benchmarks.tools.code_shape                                         # this checkout's package
    python -m benchmarks.tools.code_shape /tmp/old --name code-shape-before       # another copy (a git worktree)

It only parses (``ast``), never imports, the package; the import arrows come from the parse the
layout test uses (``imports`` of ``tests/unit/test_layout.py``: lazy imports inside functions
count too). The result is one JSON object (``results_io.emit``), written to
``benchmarks/results/<name>.json`` when ``--name`` is given; ``code`` is the copy's commit.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import commit_of, emit

ROOT = Path(__file__).resolve().parents[2]


#: The engine options whose trail through the package the note follows.
OPTIONS = ("max_num_seqs", "label_decoding", "server_token_ids")
#: ``dict[str, Any]`` as a return annotation may be spelled (spaces removed).
DICT_ANY = {"dict[str,Any]", "Dict[str,Any]", "dict[str,typing.Any]", "typing.Dict[str,typing.Any]"}


def _layout_imports() -> Any:
    """``imports`` of the layout test, loaded from its file (tests/unit is no package)."""
    spec = importlib.util.spec_from_file_location("_layout_test", ROOT / "tests" / "unit" / "test_layout.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.imports


def _modules(package: Path) -> Iterator[tuple[Path, str]]:
    """Every ``.py`` file of ``package`` (caches skipped) and its text, in path order."""
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" not in path.parts:
            yield path, path.read_text()


def _rel(path: Path, package: Path) -> str:
    return path.relative_to(package).as_posix()


def _floors(graph: dict[str, set[str]]) -> int:
    """The longest import chain, in modules (a cycle is walked once: its back edge is not followed)."""
    depth: dict[str, int] = {}
    open_: set[str] = set()

    def walk(node: str) -> int:
        if node in depth:
            return depth[node]
        open_.add(node)
        below = [walk(n) for n in graph.get(node, ()) if n not in open_]
        open_.discard(node)
        depth[node] = 1 + max(below, default=0)
        return depth[node]

    return max((walk(n) for n in sorted(graph)), default=0)


def engines_shape(package: Path, imports: Any) -> dict[str, Any]:
    """Modules of ``engines/`` (``__init__`` files not counted), the import arrows between two of
    them (an ``__init__`` importing counts) and the floors they stand on."""
    engines = package / "engines"
    prefix = f"{package.name}.engines"
    graph = {m: {d for d in dsts if d == prefix or d.startswith(prefix + ".")}
             for m, dsts in imports(package).items() if m == prefix or m.startswith(prefix + ".")}
    modules = [p for p, _ in _modules(engines) if p.name != "__init__.py"]
    subpackages = sorted(_rel(p.parent, engines) for p in engines.rglob("__init__.py") if p.parent != engines)
    return {"engines_modules": len(modules), "engines_subpackages": subpackages,
            "engines_import_arrows": sum(len(d) for d in graph.values()), "engines_floors": _floors(graph)}


def option_files(package: Path, names: tuple[str, ...] = OPTIONS) -> dict[str, dict[str, Any]]:
    """For each name, the package files whose text mentions it, and how many."""
    texts = list(_modules(package))
    out = {}
    for name in names:
        files = [_rel(p, package) for p, text in texts if name in text]
        out[name] = {"files": len(files), "paths": files}
    return out


def _returns(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The return annotation as text without spaces ("" when there is none)."""
    ann = node.returns
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # a quoted annotation
        ann = ast.parse(ann.value, mode="eval").body
    return "" if ann is None else ast.unparse(ann).replace(" ", "")


def code_facts(package: Path) -> dict[str, Any]:
    """Counts that need the parse of every module: functions annotated to return exactly
    ``dict[str, Any]`` (and those whose return annotation holds one anywhere), the longest
    ``generate``, the ``cost_usd`` subscripts (any quotes; ``_text``: the literal ``["cost_usd"]``),
    the module count and the largest module."""
    dict_any: list[str] = []
    dict_any_inside = 0  # list[dict[str, Any]], dict[str, Any] | None, ...
    generate: dict[str, Any] = {"lines": 0, "file": None}
    cost_usd = cost_usd_text = 0
    largest: dict[str, Any] = {"lines": 0, "file": None}
    count = 0
    for path, text in _modules(package):
        count += 1
        cost_usd_text += text.count('["cost_usd"]')
        lines = len(text.splitlines())
        if lines > largest["lines"]:
            largest = {"lines": lines, "file": _rel(path, package)}
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                returns = _returns(node)
                if returns in DICT_ANY:
                    dict_any.append(f"{_rel(path, package)}:{node.lineno} {node.name}")
                dict_any_inside += any(d in returns for d in DICT_ANY)
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if node.name == "generate" and length > generate["lines"]:
                    generate = {"lines": length, "file": _rel(path, package)}
            elif isinstance(node, ast.Subscript):
                key = node.slice
                cost_usd += isinstance(key, ast.Constant) and key.value == "cost_usd"
    return {"dict_str_any_functions": len(dict_any), "dict_str_any_in_return_annotation": dict_any_inside,
            "dict_str_any": dict_any, "longest_generate": generate, "cost_usd_indexes": cost_usd,
            "cost_usd_indexes_text": cost_usd_text, "modules": count, "largest_module": largest}


def shape(package: Path) -> dict[str, Any]:
    """Everything the note reports, for the package folder ``package``."""
    return {**engines_shape(package, _layout_imports()), "options": option_files(package), **code_facts(package)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("copy", nargs="?", default=str(ROOT), help="a checkout holding sparkbatch_dagster/")
    parser.add_argument("--name", help="write benchmarks/results/<name>.json")
    args = parser.parse_args()
    copy = Path(args.copy).resolve()
    package = copy / "sparkbatch_dagster"
    if not package.is_dir():
        raise SystemExit(f"code_shape: {package} is not a folder: name a checkout that holds sparkbatch_dagster/")
    result = {"benchmark": "code_shape", "machine": machine(cpu_only=True),
              "code": commit_of(copy), "command": " ".join(["benchmarks/tools/code_shape.py", *sys.argv[1:]]),
              **shape(package)}
    emit(result, str(ROOT / "benchmarks" / "results" / f"{args.name}.json") if args.name else None)


if __name__ == "__main__":
    main()
