"""tests/e2e/test_serve_batch_kill.py's kill on the real vLLM engine (issue 59): a SIGKILLed
``serve-batch`` mid-batch leaves no ``run-batch`` child, ``VLLM::EngineCore`` or worker 10 s later
(before, all three were alive 30 s later: the child took the server's death for Ctrl-C)."""

from __future__ import annotations

import os

import psutil
import pytest

from e2e.test_serve_batch import Server, _requests
from e2e.test_serve_batch_kill import GONE_WITHIN_S

pytest.importorskip("openai")


@pytest.mark.long
def test_a_killed_server_leaves_no_engine(tmp_path, request):
    if os.environ.get("SPARKBATCH_SKIP_REAL") == "1":
        pytest.skip("SPARKBATCH_SKIP_REAL=1")
    engine = ("VLLMResource(kv_cache_memory_gb=1.0, max_num_seqs=4, max_model_len=1024, "
              "engine_kwargs={'enforce_eager': True})")
    server = Server(tmp_path, engine)
    request.addfinalizer(server.stop)
    _requests(tmp_path / "requests.jsonl", 400)  # more than the engine answers before the kill
    uploaded = server.client.files.create(file=(tmp_path / "requests.jsonl").open("rb"), purpose="batch")
    batch = server.client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                         completion_window="24h")
    server.batch(batch.id, "in_progress", least=1, deadline_s=900)  # the engine is up and answering
    children = psutil.Process(server.proc.pid).children(recursive=True)
    names = [c.name() for c in children]
    assert any("EngineCore" in n for n in names), names
    server.proc.kill()
    server.proc.wait()
    _, alive = psutil.wait_procs(children, timeout=GONE_WITHIN_S)
    left = [(c.pid, c.name()) for c in alive if c.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"alive {GONE_WITHIN_S} s after the server's SIGKILL: {left}"
