"""Module paths from before the package was laid out in rooms, kept importable.

``import sparkbatch_dagster.store`` (or ``from sparkbatch_dagster import results``) still works:
it gives the module at its new path, the same object (a monkeypatch through either name patches
both), with a ``DeprecationWarning`` that names the new path. Paths that are rooms now
(``spec``, ``estimate``, ``cli``, ``engines``, ``inputs``) re-export what the old module had.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

#: old module (under ``sparkbatch_dagster.``) -> where it lives now
MOVED = {
    "assets": "definitions.factory", "job": "definitions.job", "events": "definitions.events",
    "component": "definitions.component", "component_scaffold": "definitions.scaffold",
    "resources": "definitions.resource", "deploy": "definitions.deploy",
    "console": "cli.console", "locate": "cli.locate", "preview": "cli.preview",
    "choice": "estimate.choice", "placement": "estimate.placement", "chart": "estimate.chart",
    "runner": "run.runner", "checkpoint": "run.checkpoint", "results": "run.result_store",
    "shard_stats": "run.shard_stats", "progress": "run.progress", "metrics": "run.metrics",
    "engine_start": "engines.start", "model": "engines.model", "multinode": "engines.multinode",
    "shards": "inputs.shards", "store": "home", "digest": "home.digests", "prompts": "spec.prompts",
}
_PACKAGE = __name__.rsplit(".", 1)[0]


def load(old: str) -> ModuleType:
    """The module an old name (``store``) now is, with the warning that names its new path."""
    new = f"{_PACKAGE}.{MOVED[old]}"
    warnings.warn(f"{_PACKAGE}.{old} moved to {new}: import it from there", DeprecationWarning, stacklevel=3)
    return importlib.import_module(new)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``sparkbatch_dagster.<old>`` and hands back the module at its new path."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        prefix, _, old = fullname.partition(".")
        if prefix != _PACKAGE or old not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = load(spec.name.partition(".")[2])
        spec.loader_state = module.__spec__  # the import system sets this alias spec on the module
        return module

    def exec_module(self, module: ModuleType) -> None:
        alias = module.__spec__
        if alias is not None:  # back to its own spec, with its real name
            module.__spec__ = alias.loader_state


def install() -> None:
    """Let old paths import (once per process; after the real finders, which no longer find them)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
