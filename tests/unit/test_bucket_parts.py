"""The pieces of a bucket home on a real S3 endpoint (moto's server on loopback, s3fs): the
conditional writes, leases, the answer store across two boxes, and configuration refused early."""

from __future__ import annotations

import pytest
from dagster import EnvVar

from sparkbatch_dagster import JobSpec
from sparkbatch_dagster.errors import ConfigError
from sparkbatch_dagster.home import open_home
from sparkbatch_dagster.home.bucket import resolve_options
from testkit import make_spec


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


def test_a_yaml_job_points_at_a_bucket_with_secrets_by_reference(tmp_path, monkeypatch):
    import dagster as dg

    from sparkbatch_dagster.definitions.factory import find_job
    from unit.test_component import job_yaml, load_error, yaml_defs

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
