"""The tests of tests/unit/test_multinode.py on the real vLLM engine; that file says what they cover."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from e2e.test_multinode import _wait
from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.engines.server.server_process import free_port
from testkit import LABELS, make_rows, owned_processes, write_parquet

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.heavy  # two vLLM nodes, each its own processes


DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, SamplingSpec, VLLMResource, build_batch_assets
job = build_batch_assets(spec=JobSpec(name="split", input={src!r}, id_column="id", text_columns=["text"],
    home={home!r}, user_template="Classify: {{{{ text }}}}", output=OutputSpec(kind="label", labels={labels!r}),
    sampling=SamplingSpec(max_tokens=4), shard_count=4))
defs = Definitions(assets=job.assets, resources={{"vllm": VLLMResource(model={model!r}, tensor_parallel_size=2,
    kv_cache_memory_gb=0.25, max_num_seqs=16, max_model_len=512,
    engine_kwargs={{"load_format": "dummy", "enforce_eager": True, "nnodes": 2, "master_addr": "127.0.0.1",
                   "master_port": {port}}})}})
"""


@pytest.mark.long
def test_a_job_runs_on_one_model_split_over_two_nodes(tmp_path):
    if os.environ.get("SPARKBATCH_SKIP_REAL") == "1":
        pytest.skip("SPARKBATCH_SKIP_REAL=1")
    from sparkbatch_dagster.testing import dummy_model

    model = dummy_model("tiny", tmp_path / "llama-tiny")
    src = write_parquet(tmp_path / "in.parquet", make_rows(40))
    (tmp_path / "defs.py").write_text(DEFS.format(src=str(src), home=str(tmp_path / "home"), labels=LABELS,
                                                  model=str(model), port=free_port()))
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home"), "PYTHONPATH": str(ROOT)}

    def cli(*args: str) -> list[str]:
        return [sys.executable, "-m", "sparkbatch_dagster.cli", *args, "-f", str(tmp_path / "defs.py")]

    log = open(tmp_path / "worker-node.log", "w")  # noqa: SIM115
    node = subprocess.Popen(cli("worker-node", "--node-rank", "1"), env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        runs = []
        for extra in (["--range", "shard-00000:shard-00001"], []):  # two runs: two engines, one worker node
            proc = subprocess.run(cli("run", *extra), env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:] + (tmp_path / "worker-node.log").read_text()[-3000:]
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        assert [r["partitions_run"] for r in runs] == [2, 2] and runs[1]["partitions_done"] == 4
        labeled = [r for f in (tmp_path / "home").rglob("labeled/*.parquet") for r in pq.read_table(f).to_pylist()]
        assert sorted(r["row_id"] for r in labeled) == sorted(r["id"] for r in make_rows(40))
        assert all(r["output"] in LABELS for r in labeled)  # random weights, structured output: still a label
        assert node.poll() is None  # still serving, for the next run
        text = (tmp_path / "worker-node.log").read_text()
        assert text.count("the first node's engine stopped") == 2 and "--node-rank 1 --headless" in text
    finally:
        node.terminate()  # SIGTERM: the worker node stops its vLLM on the way out
        node.wait(60)
        log.close()
    left = [p for p in psutil.process_iter(["cmdline"]) if str(model) in " ".join(p.info["cmdline"] or [])]
    assert not left, left


@pytest.mark.long
def test_a_job_runs_on_one_model_split_over_two_tensor_parallel_ranks(tmp_path, monkeypatch):
    if os.environ.get("SPARKBATCH_SKIP_REAL") == "1":
        pytest.skip("SPARKBATCH_SKIP_REAL=1")
    from dagster import DagsterInstance, materialize

    from sparkbatch_dagster import build_batch_assets
    from sparkbatch_dagster.testing import dummy_model
    from testkit import label_then_metrics, make_spec

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    model = dummy_model("tiny", tmp_path / "llama-tiny")
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    res = VLLMResource(model=str(model), tensor_parallel_size=2, kv_cache_memory_gb=0.25, max_num_seqs=16,
                       max_model_len=512, engine_kwargs={"load_format": "dummy", "enforce_eager": True})
    inst = DagsterInstance.get()
    materialize([job.assets[0]], instance=inst, resources={"vllm": res})
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    labeled, measured = label_then_metrics(job.assets, job.keys, {"vllm": res}, inst, keys[0], keys[-1])
    assert labeled.success and measured.success
    out = job.read_outputs().to_pylist()
    assert sorted(r["row_id"] for r in out) == sorted(r["id"] for r in make_rows(40))
    assert all(r["output"] in LABELS for r in out)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ  # the ranks' core binding was the engine's alone


def test_a_worker_node_that_never_joins_stops_the_start_with_the_fix(tmp_path, monkeypatch):
    """No `sparkbatch worker-node` runs: vLLM's first node would wait for it forever (a run
    billed for nothing); the start stops at engine_start_timeout_s, names the fix, and leaves
    no vLLM process behind."""
    if os.environ.get("SPARKBATCH_SKIP_REAL") == "1":
        pytest.skip("SPARKBATCH_SKIP_REAL=1")
    from sparkbatch_dagster import EngineError
    from sparkbatch_dagster.testing import dummy_model

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    model = dummy_model("tiny", tmp_path / "llama-tiny")
    port = free_port()
    res = VLLMResource(model=str(model), tensor_parallel_size=2, kv_cache_memory_gb=0.25, max_num_seqs=16,
                       max_model_len=512, engine_start_timeout_s=45,
                       engine_kwargs={"load_format": "dummy", "enforce_eager": True, "nnodes": 2,
                                      "master_addr": "127.0.0.1", "master_port": port})
    started = time.monotonic()
    with pytest.raises(EngineError) as err:
        res.get_engine()
    waited = time.monotonic() - started
    res.close()
    text = str(err.value)
    assert "within 45s (engine_start_timeout_s)" in text and "`sparkbatch worker-node --node-rank K`" in text
    assert f"127.0.0.1:{port}" in text
    assert 45 <= waited < 45 + 60, waited  # stopped at the deadline, not after vLLM's own (30 min) timeouts

    # By owner tag, not live_children(): a worker left behind is an orphan, no longer our descendant,
    # but it keeps this test's environment. vLLM names its processes VLLM::EngineCore, VLLM::Worker_TP0, ...
    def ours() -> list[psutil.Process]:
        return owned_processes("VLLM") + owned_processes(str(model))

    _wait(lambda: not ours(), timeout=30)
