"""Output versions follow content: model identity and input signature change when bytes (or
answer-changing settings) change, and stay put when files are only touched or copied."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from sparkbatch_dagster.engines.platform import model
from sparkbatch_dagster.engines.platform.model import model_identity
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.home import digests as digest
from sparkbatch_dagster.home.digests import file_digest, info_checksum, object_info, parquet_footer_digest
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.inputs.sources import signature
from testkit import make_rows, make_spec, write_parquet


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPARKBATCH_CACHE_DIR", str(cache))
    model._identity.cache_clear()  # each test sees the digest cache, not an earlier test's answers
    return cache


def fake_model(root: Path, template: str = "{{ messages }}") -> Path:
    folder = root / "tiny-model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    (folder / "model.safetensors").write_bytes(os.urandom(64 * 1024))
    return folder


def touch(path: Path, seconds: int = 1000) -> None:
    """Move a file's mtime (as a copy, checkout or `touch` would) without changing its bytes."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 10**9))


def counting_open(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every file digest.py opens (the module-level name shadows the builtin)."""
    opened: list[str] = []

    def _open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(Path(file).name)
        return open(file, *args, **kwargs)

    monkeypatch.setattr(digest, "open", _open, raising=False)
    return opened


def test_identity_names_the_folder_and_is_stable(tmp_path: Path) -> None:
    folder = fake_model(tmp_path)
    ident = model_identity(str(folder))
    name, _, short = ident.partition("@")
    assert name == "tiny-model" and len(short) == 12 and int(short, 16) >= 0
    assert model_identity(str(folder)) == ident == model_identity(str(folder), None) == model_identity(str(folder), {})
    copy = shutil.copytree(folder, tmp_path / "elsewhere" / "tiny-model")
    assert model_identity(str(copy)) == ident  # machine-independent: the same bytes elsewhere


def test_new_weights_change_identity(tmp_path: Path) -> None:
    folder = fake_model(tmp_path)
    before = model_identity(str(folder))
    other = tmp_path / "new.safetensors"
    other.write_bytes(os.urandom(64 * 1024))  # same size: only the bytes differ
    shutil.copyfile(other, folder / "model.safetensors")
    touch(folder / "model.safetensors", 1)  # a later copy; safe on file systems with coarse mtimes
    assert model_identity(str(folder)) != before


def test_extra_weight_file_changes_identity(tmp_path: Path) -> None:
    folder = fake_model(tmp_path)
    before = model_identity(str(folder))
    (folder / "adapter.bin").write_bytes(b"extra weights")
    assert model_identity(str(folder)) != before


def test_chat_template_changes_identity(tmp_path: Path) -> None:
    folder = fake_model(tmp_path)
    before = model_identity(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0] }}"}))
    touch(folder / "tokenizer_config.json", 1)
    changed = model_identity(str(folder))
    assert changed != before
    (folder / "chat_template.jinja").write_text("{{ other }}")  # a separate template file counts too
    assert model_identity(str(folder)) not in (before, changed)


def test_settings_change_identity(tmp_path: Path) -> None:
    folder = str(fake_model(tmp_path))
    short = model_identity(folder, {"max_model_len": 1024, "dtype": "auto"})
    assert short == model_identity(folder, {"dtype": "auto", "max_model_len": 1024})  # key order is no change
    assert short != model_identity(folder, {"max_model_len": 2048, "dtype": "auto"})
    assert short != model_identity(folder)


def test_touching_files_keeps_identity(tmp_path: Path) -> None:
    folder = fake_model(tmp_path)
    before = model_identity(str(folder), {"max_model_len": 1024})
    for f in folder.iterdir():
        touch(f)
    assert model_identity(str(folder), {"max_model_len": 1024}) == before


def test_dummy_folder_without_weights_and_hub_names(tmp_path: Path) -> None:
    folder = fake_model(tmp_path)
    with_weights = model_identity(str(folder))
    (folder / "model.safetensors").unlink()  # load_format="dummy": config + tokenizer only
    dummy = model_identity(str(folder))
    assert dummy.startswith("tiny-model@") and dummy != with_weights
    hub = model_identity("org/some-model")
    assert hub.startswith("org/some-model@") and hub == model_identity("org/some-model", {})
    assert hub != model_identity("org/some-model", {"max_model_len": 2048})
    assert hub != model_identity("org/other-model")


def test_digest_cache_hashes_a_weight_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                _cache_dir: Path) -> None:
    folder = fake_model(tmp_path)
    opened = counting_open(monkeypatch)
    first = model_identity(str(folder))
    assert opened.count("model.safetensors") == 1
    entries = json.loads((_cache_dir / "digests.json").read_text())
    weights = str((folder / "model.safetensors").resolve())
    assert entries[weights][2] == hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()

    model._identity.cache_clear()  # a new process: only the digest cache is left
    assert model_identity(str(folder)) == first
    assert opened.count("model.safetensors") == 1  # not reopened

    touch(folder / "model.safetensors")  # new mtime, same bytes: rehashed once, same identity
    assert model_identity(str(folder)) == first
    model._identity.cache_clear()
    assert model_identity(str(folder)) == first
    assert opened.count("model.safetensors") == 2


@pytest.mark.parametrize("junk", [b"", b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_bad_cache_file_is_ignored(tmp_path: Path, _cache_dir: Path, junk: bytes) -> None:
    f = tmp_path / "data.bin"
    f.write_bytes(b"hello")
    _cache_dir.mkdir()
    (_cache_dir / "digests.json").write_bytes(junk)
    assert file_digest(f) == hashlib.sha256(b"hello").hexdigest()
    assert str(f.resolve()) in json.loads((_cache_dir / "digests.json").read_text())  # rewritten whole


def test_cache_forgets_deleted_files(tmp_path: Path, _cache_dir: Path) -> None:
    gone, kept = tmp_path / "gone.bin", tmp_path / "kept.bin"
    gone.write_bytes(b"a")
    kept.write_bytes(b"b")
    file_digest(gone)
    gone.unlink()
    file_digest(kept)
    assert list(json.loads((_cache_dir / "digests.json").read_text())) == [str(kept.resolve())]
    assert not [p for p in _cache_dir.iterdir() if p.name != "digests.json"]  # no temp files left


def test_parquet_footer_digest(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "rows.parquet", make_rows(50))
    before = parquet_footer_digest(path)
    touch(path)
    assert parquet_footer_digest(path) == before
    rows = make_rows(50)
    rows[10]["text"] = rows[10]["text"].replace("Item", "Itex")  # one row, same length
    assert rows != make_rows(50)
    write_parquet(path, rows)
    assert parquet_footer_digest(path) != before
    not_parquet = tmp_path / "rows.csv"
    not_parquet.write_text("id,text\n1,PAR1\n")
    assert parquet_footer_digest(not_parquet) == file_digest(not_parquet)


def test_object_checksums() -> None:
    assert info_checksum({"ETag": '"abc123"', "size": 7}) == "etag:abc123:7"
    assert info_checksum({"md5Hash": "bWQ1", "crc32c": "x", "size": 3}) == "md5hash:bWQ1:3"
    assert info_checksum({"name": "x", "size": 3, "mtime": 5}) is None
    fsspec = pytest.importorskip("fsspec")
    with fsspec.open("memory://sparkbatch-test/a.csv", "wb") as fh:
        fh.write(b"id,text\n")
    assert info_checksum(object_info("memory://sparkbatch-test/a.csv")) is None  # the memory store keeps none


def _shard_twice(spec: Any, rewrite: Any) -> None:
    """Shard, touch the input: reused; rewrite one row: re-sharded under a new signature."""
    home = JobHome(spec.home_path)
    first = build_shards(spec, home)
    assert first["reused"] is False
    touch(Path(spec.input))
    again = build_shards(spec, home)
    assert again["reused"] is True and again["signature"] == first["signature"]
    rewrite()
    changed = build_shards(spec, home)
    assert changed["reused"] is False and changed["signature"] != first["signature"]


def test_parquet_signature_follows_content(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, n=60)
    rows = make_rows(60)
    rows[7]["text"] = "A different thing."
    _shard_twice(spec, lambda: write_parquet(Path(spec.input), rows))


def test_csv_signature_follows_content(tmp_path: Path) -> None:
    src = tmp_path / "csv" / "rows.csv"
    src.parent.mkdir()

    def write(rows: list[dict[str, Any]]) -> None:
        with open(src, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=["id", "text", "gold"])
            writer.writeheader()
            writer.writerows(rows)

    write(make_rows(60))
    spec = make_spec(tmp_path, n=60, input=str(src))
    rows = make_rows(60)
    rows[8]["text"] = rows[8]["text"].replace("Item", "Itex")  # same size: only content tells
    assert rows != make_rows(60)
    _shard_twice(spec, lambda: write(rows))


def test_remote_signature_without_checksum_falls_back_to_size_and_time(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    url = "memory://sparkbatch-sig/rows.csv"
    spec = make_spec(tmp_path, input=url)
    with fsspec.open(url, "wb") as fh:
        fh.write(b"id,text,gold\n1,a car,vehicle\n")
    first = signature(spec, [url])
    assert signature(spec, [url]) == first
    with fsspec.open(url, "wb") as fh:
        fh.write(b"id,text,gold\n1,a bicycle,vehicle\n")
    assert signature(spec, [url]) != first


def test_new_weights_or_another_max_model_len_is_a_new_output_version(tmp_path: Path) -> None:
    """Through the resource and the job, as a run computes it: no mixing of two models' rows."""
    from sparkbatch_dagster import VLLMResource, build_batch_assets

    folder = fake_model(tmp_path)
    job = build_batch_assets(spec=make_spec(tmp_path, n=30))
    build_shards(job.spec, job.home)
    res = VLLMResource(model=str(folder), max_model_len=1024)
    first = job.output_version(res)
    assert job.output_version(VLLMResource(model=str(folder), max_model_len=1024, max_num_seqs=8)) == first
    assert job.output_version(VLLMResource(model=str(folder), max_model_len=2048)) != first
    assert job.output_version(VLLMResource(model=str(folder), max_model_len=1024,
                                           engine_kwargs={"quantization": "fp8"})) != first
    (folder / "model.safetensors").write_bytes(os.urandom(64 * 1024))  # new weights, same folder
    assert job.output_version(res) != first


# --- files engine_kwargs name, and remote code, count by their bytes -----------------------------


def test_a_chat_template_file_in_engine_kwargs_counts_by_its_content(tmp_path: Path) -> None:
    folder = str(fake_model(tmp_path))
    template = tmp_path / "templates" / "chat.jinja"
    template.parent.mkdir()
    template.write_text("{{ messages }}")
    settings = {"dtype": "auto", "chat_template": str(template)}
    before = model_identity(folder, settings)
    template.write_text("{{ messages[0] }}")  # the same path, another template
    touch(template, 1)
    edited = model_identity(folder, settings)
    assert edited != before
    elsewhere = tmp_path / "copy.jinja"
    shutil.copyfile(template, elsewhere)
    assert model_identity(folder, {**settings, "chat_template": str(elsewhere)}) == edited  # bytes, not the path
    touch(template)
    assert model_identity(folder, settings) == edited
    long_inline = "{{ messages }}" * 400  # an inline template too long to be a file name: itself
    assert model_identity(folder, {"chat_template": long_inline}) != model_identity(folder, {"chat_template": "x"})


@pytest.mark.parametrize("key, name", [("tokenizer", "tokenizer_config.json"),
                                       ("generation_config", "generation_config.json")])
def test_a_folder_in_engine_kwargs_counts_by_its_files(tmp_path: Path, key: str, name: str) -> None:
    folder = str(fake_model(tmp_path))
    other = tmp_path / "other"
    other.mkdir()
    (other / name).write_text(json.dumps({"top_k": 5}))
    before = model_identity(folder, {key: str(other)})
    (other / name).write_text(json.dumps({"top_k": 6}))
    touch(other / name, 1)
    assert model_identity(folder, {key: str(other)}) != before
    assert model_identity(folder, {key: "org/hub-tokenizer"}) != model_identity(folder, {key: "org/other"})


def test_an_edited_chat_template_is_a_new_identity_through_the_resource(tmp_path: Path) -> None:
    from sparkbatch_dagster import VLLMResource

    folder = fake_model(tmp_path)
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages }}")
    res = VLLMResource(model=str(folder), engine_kwargs={"chat_template": str(template)})
    before = res.model_identity()
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    touch(template, 1)
    assert res.model_identity() != before


def test_trust_remote_code_and_the_code_it_runs_are_part_of_the_identity(tmp_path: Path) -> None:
    from sparkbatch_dagster import VLLMResource
    from sparkbatch_dagster.engines.platform.model import THROUGHPUT_ONLY

    assert "trust_remote_code" not in THROUGHPUT_ONLY
    folder = fake_model(tmp_path)
    (folder / "modeling_tiny.py").write_text("SCALE = 1\n")
    plain = VLLMResource(model=str(folder)).model_identity()
    remote = VLLMResource(model=str(folder), engine_kwargs={"trust_remote_code": True})
    first = remote.model_identity()
    assert first != plain
    (folder / "modeling_tiny.py").write_text("SCALE = 2\n")  # the model's own code, edited
    touch(folder / "modeling_tiny.py", 1)
    assert remote.model_identity() != first
    assert VLLMResource(model=str(folder)).model_identity() == plain  # code vLLM does not run is not part of it
