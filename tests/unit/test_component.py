"""A job as a folder with a defs.yaml (``BatchInferenceComponent``): the same assets as the
Python factory, a run through the YAML-built Definitions on the fake engine, templated values,
errors with field and line, and the ``dg`` commands (subprocesses in a tmp dg project)."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster.components.testing import create_defs_folder_sandbox

from sparkbatch_dagster import BatchInferenceComponent, JobSpec, VLLMResource, build_batch_assets
from sparkbatch_dagster.cli import load
from sparkbatch_dagster.definitions.factory import find_job
from testkit import make_spec

ROOT = Path(__file__).resolve().parents[2]
TYPE = "sparkbatch_dagster.BatchInferenceComponent"
NAMES = ("input_shards", "labeled_outputs", "run_metrics", "analytics", "estimate", "review_queue", "human_labels")


def job_yaml(spec: JobSpec, **extra: Any) -> str:
    """The defs.yaml that declares ``spec`` (only the fields that differ from the defaults)."""
    attributes = {**spec.model_dump(mode="json", exclude_defaults=True), **extra}
    return yaml.safe_dump({"type": TYPE, "attributes": attributes}, sort_keys=False)


@contextmanager
def yaml_defs(**folders: str | dict[str, str]) -> Iterator[tuple[dg.Definitions, Path]]:
    """Definitions loaded by dg from a defs folder with one subfolder per job (``name=defs.yaml
    text``, or ``name={file: text}``); yields them and the defs folder."""
    with create_defs_folder_sandbox() as sandbox:
        for name, files in folders.items():
            folder = sandbox.defs_folder_path / name
            folder.mkdir(parents=True)
            for file, text in ({"defs.yaml": files} if isinstance(files, str) else files).items():
                (folder / file).write_text(text)
        with sandbox.build_all_defs() as defs:
            yield defs, sandbox.defs_folder_path


def load_error(**folders: str) -> str:
    with pytest.raises(Exception) as info, yaml_defs(**folders):
        pass
    chain, exc = [], info.value
    while exc is not None:  # dagster wraps the component's own error
        chain.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(chain)


def test_a_defs_yaml_builds_what_the_python_factory_builds(tmp_path):
    spec = make_spec(tmp_path)
    python = build_batch_assets(spec=spec, resource=VLLMResource(), upstream=[dg.AssetKey(["raw", "rows"])])
    by_key = {a.key: a for a in python.assets}
    with yaml_defs(things=job_yaml(spec, upstream=["raw/rows"])) as (defs, _):
        assets = {a.key: a for a in defs.assets}
        assert set(assets) == set(by_key) == {dg.AssetKey(["things", n]) for n in NAMES}
        for key, made in assets.items():
            ref = by_key[key]
            assert made.partitions_def == ref.partitions_def
            assert made.descriptions_by_key == ref.descriptions_by_key
            assert made.code_versions_by_key == ref.code_versions_by_key
            assert made.group_names_by_key == ref.group_names_by_key
            assert made.check_specs_by_output_name.keys() == ref.check_specs_by_output_name.keys()
            assert {k: sorted(map(str, v)) for k, v in made.asset_deps.items()} == \
                   {k: sorted(map(str, v)) for k, v in ref.asset_deps.items()}
        job = find_job(dg.AssetKey(["things", "labeled_outputs"]))
        assert job is not None and job.spec == spec
        assert defs.resources == {"vllm": VLLMResource()}


def test_templated_values_and_env_settings(tmp_path, monkeypatch):
    spec = make_spec(tmp_path)
    text = job_yaml(spec, shard_count="{{ env('T_SHARDS', 2) }}", engine={
        "max_num_seqs": "{{ env('T_SEQS', 64) }}", "model": {"env": "T_MODEL"}, "engine_kwargs": {"seed": 3}},
        max_partitions_per_run="{{ env('T_PER_RUN', 2) }}", pool=None)
    monkeypatch.setenv("T_SHARDS", "5")
    with yaml_defs(things=text) as (defs, _):
        job = find_job(dg.AssetKey(["things", "labeled_outputs"]))
        assert job is not None and job.spec.shard_count == 5
        labeled = next(a for a in defs.assets if a.key == job.keys["labeled_outputs"])
        assert labeled.backfill_policy == dg.BackfillPolicy.multi_run(2) and labeled.op.pool is None
        engine = defs.resources["vllm"]
        assert engine.max_num_seqs == 64 and engine.engine_kwargs == {"seed": 3}
        assert isinstance(engine.model, dg.EnvVar) and engine.model.env_var_name == "T_MODEL"  # read at run time
    monkeypatch.delenv("T_SHARDS")
    with yaml_defs(things=text):
        assert find_job(dg.AssetKey(["things", "labeled_outputs"])).spec.shard_count == 2  # type: ignore[union-attr]


def test_a_bad_value_is_reported_with_its_field_and_line(tmp_path):
    spec = make_spec(tmp_path)
    text = job_yaml(spec, shard_count="{{ env('T_UNSET_SHARDS', 0) }}")
    line = 1 + next(i for i, t in enumerate(text.splitlines()) if t.startswith("  shard_count:"))
    err = load_error(things=text)
    assert f"defs.yaml:{line}: attributes.shard_count: Input should be greater than or equal to 1 (got 0)" in err
    bad_engine = job_yaml(make_spec(tmp_path), engine={"max_num_seqs": "{{ 0 }}"})
    line = 1 + bad_engine.splitlines().index("  engine:") + 1
    assert f"defs.yaml:{line}: attributes.engine.max_num_seqs: Input should be greater" in load_error(things=bad_engine)
    per_run = job_yaml(make_spec(tmp_path), max_partitions_per_run="{{ env('T_UNSET_PER_RUN', 0) }}")
    assert "attributes.max_partitions_per_run: Input should be greater than or equal to 1" in load_error(things=per_run)
    unknown = job_yaml(make_spec(tmp_path)).replace("{{ text }}", "{{ text }} {{ colour }}")
    assert "attributes.user_template: user_template uses ['colour']" in load_error(things=unknown)


def test_two_yaml_jobs_share_one_engine_or_say_why_they_cannot(tmp_path):
    one, two = make_spec(tmp_path / "a", name="one"), make_spec(tmp_path / "b", name="two")
    same = {"max_num_seqs": 512}
    with yaml_defs(one=job_yaml(one, engine=same), two=job_yaml(two, engine=same)) as (defs, _):
        assert len(defs.assets) == 2 * len(NAMES) and list(defs.resources) == ["vllm"]  # equal settings: one resource
    err = load_error(one=job_yaml(one), two=job_yaml(two, engine={"max_num_seqs": 8}))
    assert "'one'" in err and "'two'" in err and "both use resource_key 'vllm'" in err
    assert "max_num_seqs: None vs 8" in err and "resource_key: vllm_" in err
    with yaml_defs(one=job_yaml(one), two=job_yaml(two, engine={"max_num_seqs": 8}, resource_key="big")) as (defs, _):
        assert sorted(defs.resources) == ["big", "vllm"]


def test_the_component_in_python_and_the_cli_finds_yaml_and_lazy_jobs(tmp_path):
    spec = make_spec(tmp_path)
    component = BatchInferenceComponent(spec=spec, engine={"max_num_seqs": 32}, key_prefix=["team", "jobs"])
    defs = component.build_defs(dg.ComponentTree.for_test().load_context)
    assert {a.key for a in defs.assets} == {dg.AssetKey(["team", "jobs", n]) for n in NAMES}
    file = tmp_path / "lazy_defs.py"
    file.write_text(textwrap.dedent(f"""
        import dagster as dg
        from sparkbatch_dagster import JobSpec, VLLMResource, build_batch_assets

        @dg.definitions
        def defs():
            spec = JobSpec.model_validate_json({spec.model_dump_json()!r})
            return dg.Definitions(assets=build_batch_assets(spec=spec).assets, resources={{"vllm": VLLMResource()}})
    """))
    job, loaded = load(str(file), None)
    assert job.spec == spec and isinstance(loaded, dg.Definitions)


def test_the_demo_is_declared_in_yaml_with_the_same_job(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from assets.debian import SECTIONS

    monkeypatch.delenv("SPARKBATCH_DEMO_SHARDS", raising=False)
    job, _ = load(str(ROOT / "definitions.py"), None)
    assert [str(k) for k in (job.keys[n] for n in NAMES)] == [str(dg.AssetKey(["debian_sections", n])) for n in NAMES]
    spec = job.spec
    assert spec.name == "debian_sections" and spec.shard_count == 8 and spec.gold_column == "section"
    assert spec.output.kind == "label" and spec.output.labels == SECTIONS and len(SECTIONS) == 58
    # Byte for byte the prompt the Python spec had: existing homes keep their output version.
    assert spec.system_prompt == "You sort Debian packages into archive sections. Allowed sections: " + \
        ", ".join(SECTIONS) + "."
    assert spec.sampling.max_tokens == 8 and spec.estimate.models == ["gemma-3-270m"]
    assert spec.estimate.accuracy_bar == 0.2


def test_a_bad_sink_is_reported_once_at_its_line(tmp_path):
    text = job_yaml(make_spec(tmp_path), sink={"format": "delta", "uri": "ftp://x/t"})
    line = 1 + next(i for i, t in enumerate(text.splitlines()) if "ftp://x/t" in t)
    err = load_error(things=text)
    assert re.search(rf"attributes\.sink\.uri at \S+defs\.yaml:{line}`\n  Value error, sink\.uri 'ftp://x/t': "
                     "delta-rs cannot write to ftp://", err), err
    assert "1 validation error" in err and "constrained-str" not in err  # literal YAML, not a template: one error
