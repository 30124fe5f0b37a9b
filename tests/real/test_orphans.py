"""The tests of tests/e2e/test_orphans.py on the real vLLM engine; that file says what they cover."""

from __future__ import annotations

from e2e.test_orphans import _killed_leaves_nothing, _start


def test_a_sigkilled_process_leaves_no_vllm_engine_core(tmp_path):
    code = """
import sys, time
sys.path.insert(0, "tests/support")
import psutil
from testkit import REAL_SETTINGS
from sparkbatch_dagster import VLLMResource
if __name__ == "__main__":
    VLLMResource(**{**REAL_SETTINGS, "keep_warm": False}).get_engine()
    cores = [p.pid for p in psutil.Process().children(recursive=True) if "EngineCore" in p.name()]
    print("CORES", *cores, flush=True)
    time.sleep(3600)
"""
    proc, report = _start(tmp_path, code)
    line = ""
    while not line.startswith("CORES"):  # vLLM logs to stdout too
        line = proc.stdout.readline()
        assert line, "the process ended before its engine started"
    cores = [int(x) for x in line.split()[1:]]
    assert cores, "no engine core found"
    _killed_leaves_nothing(proc, report, cores)
