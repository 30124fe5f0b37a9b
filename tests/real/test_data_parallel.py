"""The tests of tests/unit/test_data_parallel.py on the real vLLM engine; that file says what they cover."""

from __future__ import annotations

import os

import pytest

from e2e.test_data_parallel import _label, _outputs
from sparkbatch_dagster import VLLMResource
from testkit import REAL_SETTINGS, live_children
from unit.test_data_parallel import _workers

pytestmark = pytest.mark.heavy  # two engine processes

@pytest.mark.long
def test_two_real_cpu_engines_label_a_job(tmp_path):
    if os.environ.get("SPARKBATCH_SKIP_REAL") == "1":
        pytest.skip("SPARKBATCH_SKIP_REAL=1")
    cores = len(live_children("EngineCore"))  # the session's warm engine, if another test started it
    res = VLLMResource(**{**REAL_SETTINGS, "keep_warm": False, "data_parallel_size": 2})
    job, inst, keys, result = _label(tmp_path, res, n=24, shards=2)
    assert result.success
    recs = inst.fetch_materializations(job.keys["labeled_outputs"], limit=10).records
    assert sorted(r.partition_key for r in recs) == keys
    assert len(_outputs(job)) == 24
    assert not _workers() and len(live_children("EngineCore")) <= cores
