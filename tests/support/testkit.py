"""What tests of every tier build their cases from: rows whose label follows from the text, a
job spec over them, the real engine's test settings, waits and process look-ups that see only this
test's own processes.

Importable as ``testkit`` from any test (``pythonpath`` in pyproject.toml puts ``tests/support`` on
the path), and from a script a test runs (``sys.path.insert(0, str(SUPPORT))``).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from sparkbatch_dagster import JobSpec, OutputSpec, SamplingSpec, VLLMResource
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.testing import FakeVLLMResource

#: This folder (for a script a test runs: ``sys.path.insert(0, str(SUPPORT))``) and the repository.
SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
#: Set for every test to a value of its own (common_fixtures.py); the processes it starts inherit it, so
#: :func:`owned_processes` finds them even once they are orphans, and never another test's or session's.
OWNER_ENV = "SPARKBATCH_TEST_OWNER"

LABELS = ["fruit", "vehicle", "animal"]
WORDS = {"fruit": ["apple", "banana", "cherry"], "vehicle": ["car", "truck", "bicycle"],
         "animal": ["dog", "cat", "horse"]}


def make_rows(n: int) -> list[dict[str, Any]]:
    """Rows whose gold label follows from the text; every 7th text repeats an earlier one."""
    rows = []
    for i in range(n):
        label = LABELS[i % 3]
        word = WORDS[label][(i // 3) % 3]
        text = f"A {word}." if i % 7 == 0 else f"Item {i}: a {word} seen on day {i % 11}."
        rows.append({"id": f"id-{i:05d}", "text": text, "gold": label})
    return rows


def unique_rows(n: int) -> list[dict[str, Any]]:
    """:func:`make_rows` with every text distinct: one engine request per row, so traces count rows."""
    rows = make_rows(n)
    for i, r in enumerate(rows):
        r["text"] = f"{r['text']} #{i}"
    return rows


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def make_spec(tmp_path: Path, n: int = 120, shards: int = 4, **overrides: Any) -> JobSpec:
    src = tmp_path / "in" / "rows.parquet"
    if not src.exists():
        write_parquet(src, make_rows(n))
    fields: dict[str, Any] = dict(
        name="things", input=str(src), id_column="id", text_columns=["text"],
        system_prompt="Answer with one word: fruit, vehicle or animal.",
        user_template="What kind of thing is this? {{ text }}",
        output=OutputSpec(kind="label", labels=LABELS), sampling=SamplingSpec(max_tokens=4),
        shard_count=shards, gold_column="gold", home=str(tmp_path / "home"),
        checkpoint_rows=8, checkpoint_seconds=0.5,
    )
    fields.update(overrides)
    return JobSpec(**fields)


def one_shard(tmp_path: Path, rows: list[dict[str, Any]], **overrides: Any) -> tuple[JobSpec, JobHome]:
    """A job over ``rows`` in a single shard, sharded: its spec and home."""
    src = write_parquet(tmp_path / "in" / "rows.parquet", rows)
    spec = make_spec(tmp_path, input=str(src), shards=1, **overrides)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    return spec, home


def written_parts(home: JobHome, version: str, key: str) -> list[dict[str, Any]]:
    """The rows a shard's checkpoint part files hold (written, not yet committed)."""
    return [r for p in home.parts_dir(version, key).glob("part-*.parquet") for r in pq.read_table(p).to_pylist()]



def label_defs_yaml(tmp_path: Path, more: str, output_extra: str = "") -> str:
    """A ``things/defs.yaml`` of a label job over :func:`make_spec`'s input, with ``more``
    (attribute lines, indented as attributes) and ``output_extra`` (more keys of ``output``)."""
    import textwrap

    head = textwrap.dedent(f"""\
        type: sparkbatch_dagster.BatchInferenceComponent
        attributes:
          name: things
          input: {make_spec(tmp_path).input}
          text_columns: [text]
          user_template: "What is this? {{{{ text }}}}"
          output: {{kind: label, labels: [fruit, vehicle, animal]{output_extra}}}
        """)
    return head + textwrap.indent(textwrap.dedent(more), "  ")


def yaml_job_spec(text: str) -> JobSpec:
    """The JobSpec a ``things/defs.yaml`` of ``text`` builds, loaded as `dg` loads a defs folder."""
    import dagster as dg
    from dagster.components.testing import create_defs_folder_sandbox

    from sparkbatch_dagster.definitions.factory import find_job

    with create_defs_folder_sandbox() as sandbox:
        (sandbox.defs_folder_path / "things").mkdir(parents=True)
        (sandbox.defs_folder_path / "things" / "defs.yaml").write_text(text)
        with sandbox.build_all_defs():
            job = find_job(dg.AssetKey(["things", "labeled_outputs"]))
            assert job is not None
            return job.spec


def wait_until(what: str, ok: Callable[[], Any], explain: Callable[[], str] = lambda: "",
               deadline_s: float = 120.0) -> Any:
    """Poll ``ok`` until it returns something true, and return that: a wait for a state, whose
    deadline only bounds a hang (``explain``: what to show when it comes)."""
    deadline = time.monotonic() + deadline_s
    while not (value := ok()):
        assert time.monotonic() < deadline, f"{what}: not within {deadline_s:.0f} s. {explain()}"
        time.sleep(0.05)
    return value


def owned_processes(*words: str, tag: str | None = None) -> list[psutil.Process]:
    """Live processes anywhere on the machine that this test started (its owner tag in their
    environment, orphans included) whose command line holds every word; ``tag``: another owner's."""
    tag = tag or os.environ[OWNER_ENV]
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid == os.getpid() or p.status() == psutil.STATUS_ZOMBIE or p.environ().get(OWNER_ENV) != tag:
                continue
            name_and_cmd = p.name() + " " + " ".join(p.cmdline())
            if all(w in name_and_cmd for w in words):
                found.append(p)
        except psutil.Error:  # it exited while we looked, or is not ours to read
            pass
    return found


def live_children(*words: str) -> list[psutil.Process]:
    """Live descendants of this process whose command line holds every word (a zombie is gone)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if p.status() != psutil.STATUS_ZOMBIE and all(w in cmd for w in words):
                found.append(p)
        except psutil.Error:  # it exited while we looked
            pass
    return found


#: The session's real engine: every test that builds ``VLLMResource(**REAL_SETTINGS)`` goes
#: through the resource's own lifecycle (get_engine, teardown) and gets the warm engine.
#: ``enforce_eager``: no torch.compile warm-up, 39 s of each engine start on a 2-core CPU against 1 s
#: (an engine start 96 s -> 48 s). What these tests check is this package on a real engine, not
#: vLLM's compiler; `make demo`, its test (test_cli_demo.py) and the benchmarks run the default.
EAGER: dict[str, Any] = {"enforce_eager": True}
REAL_SETTINGS: dict[str, Any] = dict(kv_cache_memory_gb=1.0, max_num_seqs=64, max_model_len=1024, keep_warm=True,
                                     engine_kwargs=EAGER)


@functools.cache
def exact_numerics() -> bool:
    """Whether the session's real engine computes in float32, where an answer does not move with
    what it was batched with (see :func:`confidence_tolerance`); in bf16 it may: a near tie flips,
    and the grammar may spell the same label in other tokens (seen on a 2-core AMX Xeon: "neutral"
    in 6 tokens against 5). Once per session, as the engine is started once."""
    return VLLMResource(**REAL_SETTINGS).dtype_choice()[0] == "float32"


def confidence_tolerance() -> float:
    """How far one answer's confidence may move between two real engines of the same model.

    vLLM's CPU kernels pick their blocking by batch size, so an answer's logits depend on what it
    was batched with: a server batches requests as they arrive, the offline engine all at once. In
    float32 that moves a confidence by well under 1e-3. In bf16 (the default on a CPU with native
    bf16) by far more: 0.026 for one of test_label_tokens' 9 reviews between batchings of 1, 2, 3
    and all 9 prompts on this 2-core CPU. A confidence read from the wrong token (the bug these
    comparisons look for) is off by the other labels' share, tenths."""
    return 1e-3 if exact_numerics() else 0.06


def fake_resource(**fake: Any) -> tuple[FakeVLLMResource, FakeEngine]:
    """A FakeVLLMResource (``fake``: its FakeEngine settings) and its engine, fresh for this test
    (its request count at 0).

    ``keep_warm`` makes every copy Dagster makes of the resource find this same engine.
    """
    res = FakeVLLMResource(keep_warm=True, **fake)
    res.shutdown()  # drop an engine an earlier test left warm under the same settings
    engine = res.get_engine()
    assert isinstance(engine, FakeEngine)
    return res, engine


def label_then_metrics(assets: Any, keys: dict, res: dict, inst: Any, first: str, last: str) -> tuple[Any, Any]:
    """labeled_outputs over first..last, then run_metrics in its own run, as a backfill runs them
    (labeled_outputs' run yields each partition as it commits and no output at its end)."""
    from dagster import materialize

    tags = {"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last}
    labeled = materialize(assets, selection=[keys["labeled_outputs"]], resources=res, instance=inst, tags=tags)
    measured = materialize(assets, selection=[keys["run_metrics"]], resources=res, instance=inst, tags=tags)
    return labeled, measured


def total(mats: Any, name: str) -> Any:
    """The sum of one metadata value over per-partition materializations."""
    return sum(m.metadata[name].value for m in mats)
