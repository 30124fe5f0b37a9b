"""The tests of tests/unit/test_encode_ahead.py on the real vLLM engine; that file says what they cover."""

import functools
import threading

from sparkbatch_dagster.engines import EngineRequest
from sparkbatch_dagster.engines.answers.encode_ahead import EncodeAhead
from sparkbatch_dagster.engines.offline import vllm_offline
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec


def test_the_real_engine_answers_alike_with_and_without_the_thread(real_engine, monkeypatch):
    # Small chunks: the 24 prompts go in 6 chunks, so encoded chunks and engine steps interleave.
    monkeypatch.setattr(real_engine, "chunk", 4)
    monkeypatch.setattr(real_engine, "window", 8)
    threads: list[str] = []
    encode = real_engine.encode

    def recording(batch, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return encode(batch, *args, **kwargs)

    monkeypatch.setattr(real_engine, "encode", recording)
    prompts = [EngineRequest(str(i), [{"role": "user", "content": f"Name a word that rhymes with {w}."}])
               for i, w in enumerate(["cat", "dog", "tree", "blue", "sun", "car"] * 4)]
    sampling = SamplingSpec(max_tokens=6, temperature=0.0)
    answers = {}
    for threaded in (True, False):
        monkeypatch.setattr(vllm_offline, "EncodeAhead", functools.partial(EncodeAhead, threaded=threaded))
        threads.clear()
        results = list(real_engine.generate(prompts, sampling, OutputSpec(kind="text")))
        assert sorted(r.id for r in results) == sorted(p.id for p in prompts)
        answers[threaded] = {r.id: (r.text, r.prompt_tokens) for r in results}
        on_thread = [name.startswith("sparkbatch-encode") for name in threads]
        assert len(threads) == 6 and all(on_thread) == threaded and any(on_thread) == threaded
    assert answers[True] == answers[False]
    # Each row kept its own prompt: the same question has the same answer and prompt length.
    assert len({answers[True][str(i)] for i in range(0, 24, 6)}) == 1
