"""The pieces of a bucket home on a real S3 endpoint (moto's server on loopback, s3fs): the
conditional writes, leases, the answer store across two boxes, and configuration refused early."""

from __future__ import annotations

import json
import threading
import time

import pytest
from dagster import EnvVar

from conftest import make_spec
from sparkbatch_dagster import JobSpec
from sparkbatch_dagster.errors import ConfigError
from sparkbatch_dagster.home import Bucket, open_home
from sparkbatch_dagster.home.bucket import resolve_options
from sparkbatch_dagster.home.lease import Lease
from sparkbatch_dagster.run.result_store import ResultStore, prompt_key


def test_conditional_create_refuses_a_second_writer(s3_bucket):
    b = Bucket(f"s3://{s3_bucket}/job")
    assert b.put_bytes("commits/a.json", b"1", create=True)
    assert not b.put_bytes("commits/a.json", b"2", create=True)
    assert b.get_bytes("commits/a.json") == b"1"
    assert b.get_bytes("commits/none.json") is None


def test_a_live_lease_is_waited_for_and_an_expired_one_taken_over(s3_bucket):
    b = Bucket(f"s3://{s3_bucket}/job")
    said: list[str] = []
    first = Lease(b, "leases/v/shard-00000.json", "box-a:1:aa", seconds=1.5, say=said.append)
    second = Lease(b, "leases/v/shard-00000.json", "box-b:2:bb", seconds=1.5, say=said.append)
    assert first.acquire(wait=False)
    assert not second.acquire(wait=False)  # live: not taken
    assert second.holder() == "box-a:1:aa"
    # box-a stops renewing (it died): box-b waits, then takes the lease over and says which.
    assert second.acquire(wait=True, poll_s=0.1)
    assert any("leased by box-a:1:aa" in s and "waiting" in s for s in said)
    assert any("took over the lease of box-a:1:aa" in s for s in said)
    # box-a comes back and renews: it learns it lost the lease, and does not overwrite box-b's.
    first.renew()
    assert first.lost and not first.held
    assert json.loads(b.get_bytes("leases/v/shard-00000.json") or b"{}")["owner"] == "box-b:2:bb"
    first.release()  # not ours any more: left alone
    assert second.holder() == "box-b:2:bb"
    second.release()
    assert b.get_bytes("leases/v/shard-00000.json") is None


def test_a_renewed_lease_is_never_taken_over(s3_bucket):
    b = Bucket(f"s3://{s3_bucket}/job")
    # Renewed 20 times per lease length: a loaded machine delays a renewal, not by a lease length.
    holder = Lease(b, "leases/v/shard-00001.json", "box-a:1:aa", seconds=6.0)
    other = Lease(b, "leases/v/shard-00001.json", "box-b:2:bb", seconds=6.0)
    assert holder.acquire(wait=False)
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(0.3):
            holder.renew()

    t = threading.Thread(target=keep)
    t.start()
    try:
        deadline = time.monotonic() + 8.0  # longer than a lease
        while time.monotonic() < deadline:
            assert not other.acquire(wait=False)
            time.sleep(0.2)
    finally:
        stop.set()
        t.join()
    assert not holder.lost


def test_two_boxes_share_one_answer_store_through_the_bucket(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setattr("sparkbatch_dagster.run.result_store.FAN_IN", 4)
    remote = Bucket(f"s3://{s3_bucket}/results")
    a = ResultStore(tmp_path / "box-a", "ctx", remote)
    b = ResultStore(tmp_path / "box-b", "ctx", remote)

    def answers(lo: int, hi: int) -> list[dict]:
        return [{"prompt_key": prompt_key("", f"q{i}"), "output": f"a{i}", "error": None, "prompt_tokens": 1,
                 "output_tokens": 1, "model": "m"} for i in range(lo, hi)]

    for n in range(5):  # box a: 5 segments, merged 4 at a time (the merged one up before its inputs go)
        a.add(answers(n * 10, n * 10 + 10))
    listed = sorted(remote.list("ctx"))
    assert sum(n.startswith("seg-L1-") for n in listed) == 1 and sum(n.startswith("seg-L0-") for n in listed) == 1
    keys = [prompt_key("", f"q{i}") for i in range(60)]
    found = b.lookup(keys)  # box b: an empty cache, every answer box a stored
    assert len(found) == 50 and found[prompt_key("", "q7")] == ("a7", None)
    assert sorted(f.name for f in b.segments()) == listed


def test_storage_options_take_secrets_by_reference_only(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"storage_options\['secret'\] is a secret written in the spec"):
        make_spec(tmp_path, home="s3://b/job", storage_options={"secret": "abc"})
    monkeypatch.setenv("MY_KEY", "k-123")
    spec = make_spec(tmp_path, home="s3://b/job", storage_options={"key": EnvVar("MY_KEY"),
                                                                   "secret": {"env": "MY_SECRET"}})
    assert "k-123" not in repr(spec) and "MY_KEY" not in repr(spec)
    with pytest.raises(ConfigError, match="MY_SECRET, which is not set"):
        resolve_options(spec.storage_options)
    monkeypatch.setenv("MY_SECRET", "s-456")
    assert resolve_options(spec.storage_options) == {"key": "k-123", "secret": "s-456"}


def test_a_url_home_is_a_cache_and_a_bucket(tmp_path):
    spec = make_spec(tmp_path, home="s3://b/jobs/things/", cache_dir=str(tmp_path / "cache"))
    assert spec.home_url == "s3://b/jobs/things"
    assert spec.home_path == tmp_path / "cache"
    assert spec.result_store_url == "s3://b/jobs/things/results"
    assert spec.result_store_path == tmp_path / "cache" / "results"
    shared = make_spec(tmp_path, home=str(tmp_path / "h"), result_store="s3://b/answers")
    assert shared.home_url is None and shared.result_store_url == "s3://b/answers"
    assert JobSpec.model_validate({**spec.model_dump(), "home": f"file://{tmp_path}/h"}).home_path == tmp_path / "h"
    home = open_home(spec.home_url or "", spec.home_path)  # nothing contacted: the UI loads offline
    assert home.remote is not None and home.location == "s3://b/jobs/things"


def test_a_missing_bucket_and_bad_keys_are_one_line_each(s3_server, monkeypatch):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as missing:
        Bucket("s3://no-such-bucket-here/job").check()
    assert str(missing.value).startswith("home s3://no-such-bucket-here/job: bucket 'no-such-bucket-here' does not "
                                         "exist") and "\n" not in str(missing.value)
    bucket = s3_server.new_bucket()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(ConfigError) as refused:
        Bucket(f"s3://{bucket}/job").check()
    assert f"home s3://{bucket}/job: the store refused these credentials" in str(refused.value)
    assert "wrong" not in str(refused.value) and "\n" not in str(refused.value)


def test_a_yaml_job_points_at_a_bucket_with_secrets_by_reference(tmp_path, monkeypatch):
    import dagster as dg
    from test_component import job_yaml, load_error, yaml_defs

    from sparkbatch_dagster.definitions.factory import find_job

    spec = make_spec(tmp_path)
    text = job_yaml(spec, home="s3://my-bucket/jobs/things", cache_dir="cache",
                    storage_options={"key": {"env": "T_KEY"}, "secret": {"env": "T_SECRET"}})
    with yaml_defs(things=text) as (_, folder):
        job = find_job(dg.AssetKey(["things", "labeled_outputs"]))
        assert job is not None and job.home.location == "s3://my-bucket/jobs/things"
        assert job.spec.home_path == (folder / "things" / "cache").resolve()  # relative to the defs.yaml
        assert job.spec.storage_options == {"key": {"env": "T_KEY"}, "secret": {"env": "T_SECRET"}}
    monkeypatch.setenv("T_KEY", "k-1")
    monkeypatch.setenv("T_SECRET", "s-1")
    assert resolve_options(job.spec.storage_options) == {"key": "k-1", "secret": "s-1"}
    inline = job_yaml(spec, home="s3://my-bucket/jobs/things", storage_options={"secret": "{{ env('T_SECRET') }}"})
    assert "storage_options['secret'] is a secret written in the spec" in load_error(things=inline)
