"""The Dagster UI must load the code on a machine without vLLM: no vllm/torch at import."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout.split()
    return {m.split(".")[0] for m in out}


def test_package_import_loads_neither_vllm_nor_torch():
    mods = _loaded_after("import sparkbatch_dagster; from sparkbatch_dagster import *")
    assert "dagster" in mods
    assert not {"vllm", "torch", "transformers", "deltalake"} & mods


def test_deployment_definitions_load_without_vllm_or_torch():
    mods = _loaded_after("import definitions; definitions.defs.get_repository_def()")
    assert not {"vllm", "torch", "transformers", "deltalake"} & mods
