"""The tests of tests/unit/test_component.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
from dagster.components.testing import create_defs_folder_sandbox

from sparkbatch_dagster.cli import RANGE_END, RANGE_START
from sparkbatch_dagster.definitions.factory import find_job
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_rows, write_parquet
from unit.test_component import NAMES, TYPE

ROOT = Path(__file__).resolve().parents[2]


def test_a_yaml_job_materializes_end_to_end_on_the_fake_engine(tmp_path):
    rows = make_rows(40)
    fake_vars = textwrap.dedent("""
        import dagster as dg
        from sparkbatch_dagster.testing import FakeVLLMResource

        @dg.template_var
        def fake_engine():
            return FakeVLLMResource()
    """)
    text = textwrap.dedent(f"""
        type: {TYPE}
        template_vars_module: .template_vars
        attributes:
          name: fruits
          input: data/rows.parquet      # relative: next to this defs.yaml
          home: out
          id_column: id
          text_columns: [text]
          user_template: "What kind of thing is this? {{{{ text }}}}"
          output: {{kind: label, labels: [fruit, vehicle, animal]}}
          shard_count: 2
          gold_column: gold
          engine: "{{{{ fake_engine }}}}"
    """)
    with create_defs_folder_sandbox() as sandbox:
        folder = sandbox.defs_folder_path / "fruits"
        write_parquet(folder / "data" / "rows.parquet", rows)
        (folder / "defs.yaml").write_text(text)
        (folder / "template_vars.py").write_text(fake_vars)
        with sandbox.build_all_defs() as defs:
            job = find_job(dg.AssetKey(["fruits", "labeled_outputs"]))
            assert job is not None and job.spec.input == str(folder / "data" / "rows.parquet")
            assert job.home.root == folder / "out"
            assert isinstance(defs.resources["vllm"], FakeVLLMResource)
            inst = dg.DagsterInstance.get()
            assert dg.materialize(defs.assets, selection=[job.keys["input_shards"]], resources=defs.resources,
                                  instance=inst).success
            keys = inst.get_dynamic_partitions(job.partitions_def.name or "")
            assert len(keys) == 2
            result = dg.materialize(defs.assets, selection=[job.keys["labeled_outputs"]], resources=defs.resources,
                                    instance=inst, tags={RANGE_START: keys[0], RANGE_END: keys[-1]})
            assert result.success
            assert job.done_partitions(defs.resources["vllm"]) == keys


# --- dg itself, as a user runs it -------------------------------------------------------------


def dg_cli(cwd: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd), "DAGSTER_DISABLE_TELEMETRY": "1", "PYTHONWARNINGS": "ignore",
           "NO_COLOR": "1", "COLUMNS": "200"}
    proc = subprocess.run([str(Path(sys.executable).parent / "dg"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)
    assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def dg_project(tmp_path: Path) -> Path:
    """A bare dg project: ``proj/defs`` is its defs folder, ``proj/definitions.py`` loads it."""
    (tmp_path / "proj" / "defs").mkdir(parents=True)
    (tmp_path / "dg.toml").write_text('directory_type = "project"\n\n[project]\nroot_module = "proj"\n')
    (tmp_path / "proj" / "definitions.py").write_text(
        "from pathlib import Path\n\nimport dagster as dg\n\n"
        "defs = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)\n")
    return tmp_path


def test_dg_check_yaml_names_the_field_and_the_line(tmp_path):
    project = dg_project(tmp_path)
    (project / "proj" / "defs" / "job").mkdir()
    (project / "proj" / "defs" / "job" / "defs.yaml").write_text(textwrap.dedent(f"""\
        type: {TYPE}
        attributes:
          name: job
          input: rows.csv
          text_columns: [text]
          user_template: "{{{{ text }}}}"
          shard_cuont: 3
          sampling:
            max_tokens: many
          hourly_rate_usd: [1]
    """))
    out = dg_cli(project, "check", "yaml", ok=False).stdout
    assert "defs.yaml:7 - " in out and "attributes.shard_cuont" in out and "'shard_cuont' was unexpected" in out
    assert "defs.yaml:9 - " in out and "attributes.sampling.max_tokens 'many' is not of type 'integer'" in out
    assert "defs.yaml:10 - " in out and "attributes.hourly_rate_usd" in out


def test_dg_scaffold_writes_a_job_that_loads(tmp_path):
    project = dg_project(tmp_path)
    dg_cli(project, "scaffold", "defs", TYPE, "tickets")
    folder = project / "proj" / "defs" / "tickets"
    assert (folder / "defs.yaml").exists() and (folder / "rows.csv").exists()
    listed = json.loads(dg_cli(project, "list", "defs", "--json").stdout)
    keys = {a["asset_key"] for a in listed["assets"]}
    assert keys == {f"tickets/{n}" for n in NAMES}


def test_dg_list_defs_lists_the_demo(tmp_path):
    proc = dg_cli(ROOT, "list", "defs", "--json")
    assets = {a["asset_key"]: a for a in json.loads(proc.stdout)["assets"]}
    assert {f"debian_sections/{n}" for n in NAMES} | {"debian_sections/debian_packages"} == set(assets)
    assert assets["debian_sections/input_shards"]["dependency_keys"] == ["debian_sections/debian_packages"]
    demo = ROOT / "assets" / "defs" / "debian_sections" / "defs.yaml"
    line = 1 + demo.read_text().splitlines().index(f"type: {TYPE}")
    assert assets["debian_sections/labeled_outputs"]["source"] == f"{demo.relative_to(ROOT)}:{line}"
