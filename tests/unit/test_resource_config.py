"""VLLMResource as Dagster config: a launchpad schema without test engines, every field typed and
described, platform defaults resolved when the engine starts, EnvVars read outside a run too;
FakeVLLMResource, the test-only resource, in a real materialization."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from dagster import Definitions, EnvVar

from sparkbatch_dagster import ConfigError, VLLMResource, build_batch_assets
from sparkbatch_dagster.engines import FakeEngine, settings
from sparkbatch_dagster.engines.server.server_process import serve_args
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_spec

ROOT = Path(__file__).resolve().parents[2]


def _fields(cls: type) -> dict[str, Any]:
    return dict(cls.to_config_schema().as_field().config_type.fields)


def test_the_launchpad_schema_has_no_fake_engine_and_every_field_is_described():
    fields = _fields(VLLMResource)
    assert [v.config_value for v in fields["engine"].config_type.enum_values] == ["offline", "server"]
    assert not {"delay_s", "answer", "fail_after", "trace_path", "transient_first", "api_key_env"} & set(fields)
    assert all(f.description for f in fields.values()), [n for n, f in fields.items() if not f.description]
    key = fields["api_key"].description
    assert 'EnvVar("MY_KEY")' in key and "{{ env.MY_KEY }}" in key and "never a literal key" in key
    for name in ("gpu_memory_utilization", "max_num_seqs"):  # None = resolved at start, per platform
        assert "GPU" in fields[name].description and "CPU" in fields[name].description
    fake = _fields(FakeVLLMResource)
    assert {"delay_s", "answer", "fail_after", "trace_path", "transient_first"} <= set(fake)
    assert all(f.description for f in fake.values())


def test_definitions_with_the_resource_validate(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path))
    Definitions.validate_loadable(Definitions(assets=job.assets, resources={"vllm": VLLMResource(
        model=EnvVar("SOME_MODEL"), engine="server", server_url="http://127.0.0.1:1", api_key=EnvVar("SOME_KEY"))}))
    with pytest.raises(Exception, match="fake"):
        VLLMResource(engine="fake")  # type: ignore[arg-type]


def test_a_fixed_answer_is_another_model_identity():
    plain, fixed = FakeVLLMResource(), FakeVLLMResource(answer="fruit")
    assert plain.model_identity() == "fake-model" and FakeVLLMResource(model="m").model_identity() == "m"
    assert fixed.model_identity().startswith("fake-model@") and fixed.model_identity() != plain.model_identity()
    assert fixed.with_model("other").model_identity().startswith("other@")  # the candidate keeps the answer


def test_keep_warm_shares_an_engine_only_between_equal_settings():
    class OtherFake(FakeVLLMResource):
        pass

    a, b = FakeVLLMResource(keep_warm=True, delay_s=0.0), FakeVLLMResource(keep_warm=True, delay_s=0.0)
    a.shutdown()
    try:
        engine = a.get_engine()
        assert isinstance(engine, FakeEngine) and b.get_engine() is engine
        assert FakeVLLMResource(keep_warm=True, answer="x").get_engine() is not engine  # a field of the subclass
        assert OtherFake(keep_warm=True, delay_s=0.0).get_engine() is not engine  # another class
        a.close()
        assert b.get_engine() is engine  # close keeps it warm; shutdown does not
    finally:
        for res in (a, FakeVLLMResource(keep_warm=True, answer="x"), OtherFake(keep_warm=True, delay_s=0.0)):
            res.shutdown()


@pytest.mark.parametrize("cpu, memory, seqs", [(True, 0.3, 256), (False, 0.9, 1024)], ids=["cpu", "gpu"])
def test_defaults_follow_the_platform_when_the_engine_starts(monkeypatch, cpu, memory, seqs):
    monkeypatch.setattr(settings, "on_cpu", lambda: cpu)
    res = VLLMResource()
    assert res.max_num_seqs is None and res.gpu_memory_utilization is None  # one definition for both
    assert res.resolved_max_num_seqs() == seqs
    kw = dict(gpu_memory_utilization=None, kv_cache_memory_gb=None, max_model_len=None, enable_prefix_caching=True,
              tensor_parallel_size=1, dtype="auto", engine_kwargs={})
    assert settings.llm_kwargs(max_num_seqs=seqs, **kw)["gpu_memory_utilization"] == memory
    assert settings.llm_kwargs(max_num_seqs=8, **{**kw, "gpu_memory_utilization": 0.5})["gpu_memory_utilization"] == 0.5
    assert VLLMResource(max_num_seqs=8).resolved_max_num_seqs() == 8
    remote = VLLMResource(engine="server", server_url="http://127.0.0.1:1", model="m")
    assert remote.resolved_max_num_seqs() == 1024  # someone else's server: a GPU box's, whatever runs here


def test_engine_count_follows_the_gpus_in_both_modes(monkeypatch):
    monkeypatch.setattr(settings, "on_cpu", lambda: True)
    assert VLLMResource(engine="server").engine_count() == 1  # one engine on the CPU unless asked
    assert VLLMResource(engine="server", data_parallel_size=2).engine_count() == 2
    monkeypatch.setattr(settings, "on_cpu", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    for engine in ("offline", "server"):  # a `vllm serve` started here uses every GPU too (--data-parallel-size)
        assert VLLMResource(engine=engine).engine_count() == 4
        assert VLLMResource(engine=engine, tensor_parallel_size=2).engine_count() == 2
    assert VLLMResource(engine="server", engine_kwargs={"data_parallel_size": 3}).engine_count() == 3
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert VLLMResource(engine="server", server_urls=urls, model="m").engine_count() == 2


def test_serve_args_translate_the_offline_settings():
    assert serve_args({"max_num_seqs": 8, "enable_prefix_caching": True, "enforce_eager": False, "max_model_len": None,
                       "compilation_config": {"level": 0}}) == [
        "--max-num-seqs", "8", "--enable-prefix-caching", "--no-enforce-eager", "--compilation-config", '{"level": 0}']


def test_env_vars_are_read_outside_a_run_and_an_unset_one_is_named(monkeypatch):
    res = FakeVLLMResource(model=EnvVar("T_FAKE_MODEL"))
    monkeypatch.setenv("T_FAKE_MODEL", "from-env")
    assert res.model_identity() == "from-env" and res.model_name() == "from-env"
    monkeypatch.delenv("T_FAKE_MODEL")
    with pytest.raises(ConfigError, match=r"FakeVLLMResource\(model=EnvVar\('T_FAKE_MODEL'\)\) reads an environment "
                                          "variable that is not set"):
        res.model_identity()


def test_an_empty_api_key_is_refused_before_any_request():
    with pytest.raises(ConfigError, match="api_key is empty"):
        VLLMResource(engine="server", server_url="http://127.0.0.1:1", model="m", api_key="").get_engine()


def test_the_deployment_has_one_resource_and_the_model_comes_from_config(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    import resources

    try:
        monkeypatch.delenv("SPARKBATCH_MODEL", raising=False)
        importlib.reload(resources)
        assert resources.vllm_resource() is resources.vllm and resources.vllm.model is None  # the embedded default
        assert resources.vllm.max_num_seqs is None and resources.vllm.gpu_memory_utilization is None
        monkeypatch.setenv("SPARKBATCH_MODEL", "/models/my-8b")
        importlib.reload(resources)
        model = resources.vllm.model
        assert isinstance(model, EnvVar) and model.env_var_name == "SPARKBATCH_MODEL"  # read when a run starts
    finally:
        monkeypatch.delenv("SPARKBATCH_MODEL", raising=False)
        importlib.reload(resources)
