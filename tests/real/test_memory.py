"""The tests of tests/unit/test_memory.py on the real vLLM engine; that file says what they cover."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.engines import LazyEngine
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.engines.platform import memory, model
from sparkbatch_dagster.engines.platform.memory import GIB
from sparkbatch_dagster.errors import ConfigError
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
from testkit import REAL_SETTINGS


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKBATCH_CACHE_DIR", str(tmp_path / "cache"))
    model._identity.cache_clear()


def test_real_cpu_engine_logs_free_memory_and_refuses_what_is_not_free(real_engine):
    lines: list[str] = []
    res = VLLMResource(**REAL_SETTINGS)
    engine = LazyEngine(res.model_identity(), res.get_engine, log=lines.append)  # the identity it checks
    out = list(engine.generate([EngineRequest("a", [{"role": "user", "content": "Say hi."}])],
                               SamplingSpec(max_tokens=2), OutputSpec()))
    assert out and out[0].error is None
    assert "MemAvailable" in lines[0] and "GiB before the start" in lines[1] and "GiB after" in lines[1]
    free = memory.host().available / GIB
    with pytest.raises(ConfigError, match=r"kv_cache_memory_gb=.* needs .* GiB are free on this machine.*lower "
                                          r"VLLMResource.kv_cache_memory_gb"):
        VLLMResource(**{**REAL_SETTINGS, "kv_cache_memory_gb": round(free * 2), "keep_warm": False}).get_engine()
