"""The tests of tests/unit/test_cpu_dtype.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

import sys
from pathlib import Path


def test_the_platform_is_known_without_importing_vllm():
    """``sparkbatch run`` asks for the platform's defaults before its engine starts; vllm's import
    (14 s on this CPU) belongs to the engine's start, where it overlaps the shards' preparation.
    The fast answer is vLLM's own: checked against ``current_platform`` in the same process."""
    import subprocess

    code = ("import sys; from sparkbatch_dagster.engines import settings; fast = settings.on_cpu(); "
            "print('vllm' in sys.modules); from vllm.platforms import current_platform; "
            "print(fast == bool(current_platform.is_cpu()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split()
    assert out == ["False", "True"]
