"""The tests' shared code that a few benchmarks reuse: moto's S3 server on loopback, the Label Studio
server, the fault proxy and the fault harness (``tests/support/``).

``tests/support`` is not a package: its modules import each other by name, as pytest's ``pythonpath``
puts them. So those benchmarks run with it on ``PYTHONPATH`` (``make soak`` sets it), and stop with
the command that does when it is not::

    PYTHONPATH=.:tests/support python -m benchmarks.store.bucket_home
"""

from __future__ import annotations

import importlib
from types import ModuleType


def support(name: str) -> ModuleType:
    """``tests/support/<name>.py``, or a stop naming the ``PYTHONPATH`` that finds it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        raise SystemExit(f"{name} is tests/support/{name}.py, not on the path: run from the repository root "
                         f"with PYTHONPATH=.:tests/support python -m ...") from None
