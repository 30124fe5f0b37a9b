"""The CPU's model name and feature flags, read from ``/proc/cpuinfo`` (a simulated CPU for tests).

The dtype choice (:func:`sparkbatch_dagster.engines.settings.choose_dtype`) reads the flags and the
compile cache's key (:mod:`.compile_cache`) both.
"""

from __future__ import annotations

import os
from pathlib import Path


def cpuinfo() -> dict[str, str]:
    """The first value of each field of /proc/cpuinfo (``model name``, ``flags``, ...); empty where
    it cannot be read (not Linux). Read once per call: engine starts and cache keys ask rarely."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags (x86 ``flags``, aarch64 ``Features``); None where they cannot be
    read. ``SPARKBATCH_CPU_FLAGS`` (space-separated) replaces them: a simulated CPU, for tests."""
    given = os.environ.get("SPARKBATCH_CPU_FLAGS")
    if given is not None:
        return frozenset(given.split())
    info = cpuinfo()
    value = info.get("flags", info.get("Features"))
    return None if value is None else frozenset(value.split())
