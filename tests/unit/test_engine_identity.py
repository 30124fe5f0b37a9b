"""The engine that answers is the model the rows are stamped with: a warm engine (keep_warm) is
reused only while the model folder's files are the ones it loaded, and an engine that starts as
another identity than the run computed stops the run before its first answer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparkbatch_dagster.engines import FakeEngine, LazyEngine
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.engines.platform import model
from sparkbatch_dagster.errors import EngineError
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
from sparkbatch_dagster.testing import FakeVLLMResource


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKBATCH_CACHE_DIR", str(tmp_path / "cache"))
    model._identity.cache_clear()


def model_folder(root: Path) -> Path:
    """A tiny model folder: what an identity is computed from (no engine loads it here)."""
    folder = root / "tiny-model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    return folder


def new_weights(folder: Path) -> None:
    """Copy other weights over the same file, as a fine-tune written to the same folder would."""
    path = folder / "model.safetensors"
    before = path.stat().st_mtime_ns
    path.write_bytes(os.urandom(4096))
    os.utime(path, ns=(before + 10**9, before + 10**9))  # a later mtime even on a coarse clock


def _request() -> list[EngineRequest]:
    return [EngineRequest("a", [{"role": "user", "content": "What is an apple?"}])]


def test_the_fake_resource_names_a_model_folder_by_its_files(tmp_path):
    folder = model_folder(tmp_path)
    res = FakeVLLMResource(model=str(folder))
    first = res.model_identity()
    assert first.startswith("tiny-model@") and res.model_identity() == first
    assert FakeVLLMResource(model=str(folder), answer="fruit").model_identity() != first
    new_weights(folder)
    assert res.model_identity() != first


def test_a_warm_engine_is_not_reused_once_new_weights_are_in_its_folder(tmp_path):
    folder = model_folder(tmp_path)
    res = FakeVLLMResource(model=str(folder), keep_warm=True)
    res.shutdown()
    try:
        old = res.get_engine()
        res.close()  # the run's end: kept warm
        assert isinstance(old, FakeEngine) and old.model_id == res.model_identity() and not old.closed
        assert res.get_engine() is old  # same files: the warm engine
        res.close()
        new_weights(folder)
        new = res.get_engine()
        assert new is not old and new.model_id == res.model_identity() != old.model_id
        assert old.closed  # stopped, not left next to the new one
    finally:
        res.shutdown()


def test_an_engine_of_another_identity_stops_before_its_first_answer():
    started = FakeEngine(model_id="tiny-model@aaaaaaaaaaaa")
    engine = LazyEngine("tiny-model@bbbbbbbbbbbb", lambda: started)
    with pytest.raises(EngineError, match=r"answers as tiny-model@aaaaaaaaaaaa.*labels as tiny-model@bbbbbbbbbbbb: "
                                          r"the files of tiny-model .* changed.*Nothing was generated.*Run again"):
        next(engine.generate(_request(), SamplingSpec(max_tokens=2), OutputSpec()))
    assert started.requests_seen == 0
    other = LazyEngine("other@cccccccccccc", lambda: FakeEngine(model_id="tiny-model@aaaaaaaaaaaa"))
    with pytest.raises(EngineError, match="another model"):
        next(other.generate(_request(), SamplingSpec(max_tokens=2), OutputSpec()))
    same = LazyEngine("fake-model", FakeEngine)
    assert [r.id for r in same.generate(_request(), SamplingSpec(max_tokens=2), OutputSpec())] == ["a"]
