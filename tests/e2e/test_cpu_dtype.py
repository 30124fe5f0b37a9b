"""The CPU default fits its CPU: ``dtype="auto"`` runs float32 where the CPU has no native bf16
(a 2-core AMD EPYC with AVX and FMA, no AVX2: bf16 0.63 rows/s, float32 3.29 rows/s), the
model's own dtype elsewhere; the choice is part of the model identity and is shown by preview,
the estimate and the run's log. The flags are injected (``SPARKBATCH_CPU_FLAGS``); the last test
starts a real engine on them."""

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
