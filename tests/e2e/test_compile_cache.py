"""The tests of tests/unit/test_compile_cache.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dagster import DagsterInstance, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.definitions.compile_cache import for_resource
from sparkbatch_dagster.engines.platform import compile_cache as cc
from sparkbatch_dagster.home import JobHome, compile_store
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_spec
from unit.test_compile_cache import Log, archives, box, start

GRAPH = "inductor/fxgraph/fake-graph.bin"


def key_folder(res: FakeVLLMResource) -> Path:
    run = for_resource(res, JobHome(Path("unused")), Log())
    assert run is not None
    return run.folder


def test_this_machine_has_a_device_and_versions():
    assert cc.device().startswith(("cpu ", "gpu "))
    assert "python" in cc.versions()


# --- travelling with the home: the resource's cold start ----------------------------------------


def test_box_a_saves_and_a_fresh_box_b_restores_before_its_start(tmp_path, monkeypatch):
    home = JobHome(tmp_path / "home")
    box(monkeypatch, tmp_path, "a")
    engine, log, res = start(home)
    assert engine.compiled_from_cache is False  # nothing anywhere: A compiled
    folder = key_folder(res)
    compiled = (folder / GRAPH).read_bytes()
    res.close()
    assert archives(home) == [f"{folder.name}.tar.gz"]
    assert any("none in" in line and "this start compiles and saves it" in line for line in log.infos)
    assert any(line.startswith("compile cache: saved ") for line in log.infos)
    stored = (home.root / compile_store.archive_rel(folder.name)).stat()

    box(monkeypatch, tmp_path, "b")
    assert not key_folder(res).exists()
    engine, log, res = start(home)
    assert engine.compiled_from_cache is True  # found at its start: restored before it
    assert (key_folder(res) / GRAPH).read_bytes() == compiled  # A's bytes, not its own
    res.close()
    assert any(line.startswith("compile cache: restored ") and str(home.root) in line for line in log.infos)
    assert not any("saved" in line for line in log.infos)  # the home has it as it is: not uploaded again
    again = (home.root / compile_store.archive_rel(folder.name)).stat()
    assert (again.st_ino, again.st_mtime_ns) == (stored.st_ino, stored.st_mtime_ns)


def test_another_dtype_or_model_does_not_restore(tmp_path, monkeypatch):
    home = JobHome(tmp_path / "home")
    box(monkeypatch, tmp_path, "a")
    engine, _, res = start(home)
    res.close()
    box(monkeypatch, tmp_path, "b")
    for other in ({"dtype": "float16"}, {"model": "other-fake"}):
        engine, log, res = start(home, **other)
        assert engine.compiled_from_cache is False  # compiled: the home's archive is another key's
        assert not any("restored" in line for line in log.infos)
        res.close()
    assert len(archives(home)) == 3  # one per key


def test_a_cache_that_grew_during_the_run_is_saved_again_at_its_end(tmp_path, monkeypatch):
    home = JobHome(tmp_path / "home")
    box(monkeypatch, tmp_path, "a")
    _, log, res = start(home)
    folder = key_folder(res)
    (folder / "inductor" / "late.bin").write_bytes(b"a shape compiled mid-run")
    res.close()
    assert sum(line.startswith("compile cache: saved ") for line in log.infos) == 2
    box(monkeypatch, tmp_path, "b")
    _, _, res = start(home)
    assert (key_folder(res) / "inductor" / "late.bin").read_bytes() == b"a shape compiled mid-run"
    res.close()


def test_a_broken_archive_in_the_home_costs_a_cold_start_not_the_run(tmp_path, monkeypatch):
    home = JobHome(tmp_path / "home")
    box(monkeypatch, tmp_path, "a")
    _, _, res = start(home)
    res.close()
    path = home.root / compile_store.archive_rel(key_folder(res).name)
    path.write_bytes(path.read_bytes()[:100])  # cut short
    box(monkeypatch, tmp_path, "b")
    engine, log, res = start(home)
    assert engine.compiled_from_cache is False  # compiled as if cold
    res.close()
    assert any("saved" in line for line in log.infos)  # and the home gets a whole one back
    assert cc.unpack(path, tmp_path / "check")


def test_a_warm_engine_and_someone_elses_server_do_nothing(tmp_path, monkeypatch):
    home = JobHome(tmp_path / "home")
    box(monkeypatch, tmp_path, "a")
    _, _, res = start(home, keep_warm=True)
    res.close()  # kept warm
    try:
        log = Log()
        again = FakeVLLMResource(compile_cache=True, keep_warm=True)
        again.use_home(home, log)
        again.get_engine()
        again.close()
        assert log.infos == []  # found warm: nothing restored, nothing saved
    finally:
        res.shutdown()
    server = FakeVLLMResource(compile_cache=True, engine="server", server_url="http://127.0.0.1:1", model="m")
    assert for_resource(server, home, Log()) is None


def test_a_store_that_fails_is_a_warning_and_the_run_goes_on(tmp_path, monkeypatch):
    home = JobHome(tmp_path / "home")
    box(monkeypatch, tmp_path, "a")

    def refuse(*_: Any) -> None:
        raise OSError("the store said no")

    monkeypatch.setattr(compile_store, "store", refuse)
    engine, log, res = start(home)
    res.close()
    assert engine.compiled_from_cache is False
    assert any("save failed (OSError: the store said no)" in w for w in log.warnings)


# --- a labeling run, end to end: folder and bucket homes ----------------------------------------


def label(spec: Any, partition: str) -> tuple[list[str], Any]:
    """One ``labeled_outputs`` run of ``partition`` on a fake engine with the compile cache on:
    what its log said of the cache."""
    job = build_batch_assets(spec=spec)
    res = {"vllm": FakeVLLMResource(compile_cache=True)}
    inst = DagsterInstance.get()
    if not inst.get_dynamic_partitions(job.partitions_def.name):
        assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    result = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                         partition_key=partition)
    assert result.success
    lines = [e.user_message for e in inst.all_logs(result.run_id) if "compile cache:" in (e.user_message or "")]
    return lines, job


def test_a_labeling_run_on_a_new_box_restores_what_the_first_box_saved(tmp_path, monkeypatch):
    spec = make_spec(tmp_path, n=40, shards=2)
    box(monkeypatch, tmp_path, "a")
    lines, job = label(spec, "shard-00000")
    assert [line.split(":")[1].split()[0] for line in lines] == ["none", "saved"]
    [name] = archives(job.home)
    compiled = (tmp_path / "a" / "compile" / name.removesuffix(".tar.gz") / GRAPH).read_bytes()
    box(monkeypatch, tmp_path, "b")
    lines, _ = label(spec, "shard-00001")
    assert len(lines) == 1 and lines[0].startswith("compile cache: restored ")
    assert (tmp_path / "b" / "compile" / name.removesuffix(".tar.gz") / GRAPH).read_bytes() == compiled


def test_a_bucket_home_carries_the_cache_to_a_new_box(tmp_path, monkeypatch, s3_bucket):
    url = f"s3://{s3_bucket}/jobs/things"
    spec_a = make_spec(tmp_path, n=40, shards=2, home=url, cache_dir=str(tmp_path / "a" / "mirror"))
    box(monkeypatch, tmp_path, "a")
    lines, job = label(spec_a, "shard-00000")
    assert [line.split(":")[1].split()[0] for line in lines] == ["none", "saved"]
    assert url in lines[1]
    objects = job.home.remote.bucket.list(compile_store.FOLDER)
    [name] = objects
    compiled = (tmp_path / "a" / "compile" / name.removesuffix(".tar.gz") / GRAPH).read_bytes()

    spec_b = make_spec(tmp_path, n=40, shards=2, home=url, cache_dir=str(tmp_path / "b" / "mirror"))
    box(monkeypatch, tmp_path, "b")
    lines, job = label(spec_b, "shard-00001")
    assert len(lines) == 1 and lines[0].startswith("compile cache: restored ") and url in lines[0]
    assert (tmp_path / "b" / "compile" / name.removesuffix(".tar.gz") / GRAPH).read_bytes() == compiled
    # The download is not kept next to the unpacked folder, and the bucket's archive is not uploaded again.
    assert [p.name for p in (tmp_path / "b" / "compile").iterdir()] == [name.removesuffix(".tar.gz")]
    assert job.home.remote.bucket.list(compile_store.FOLDER) == objects
