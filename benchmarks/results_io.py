"""How every benchmark here reports: one JSON object on stdout, and the same line in a result
file under ``benchmarks/results/`` when ``--out`` names one (the README quotes those files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(result: dict[str, Any], out: str | None) -> None:
    line = json.dumps(result)
    print(line)
    if out:
        Path(out).write_text(line + "\n")
