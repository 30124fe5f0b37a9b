"""Issue 60 item 7 through the CLI, on a bucket home (moto's S3 on loopback) and a folder home: every
box reads the same reviewers' labels and calibration, and damaged review files heal.

- Box A runs a job with `review: {budget: 0.1}`, its reviewers label the queue, A runs again (the
  reviewed rows are gold: calibrated again). Box B, an empty cache and a new DAGSTER_HOME, runs
  `sparkbatch sql`: the same counts, reviewed rows, calibrated confidences and queue as A.
- A calibration, the threshold and a label file damaged in the bucket: `sql` and `run` go on (one
  warning line each), the run sets the damaged objects aside (kept) and the analytics writes the
  derived ones again; the label file's labels come back from A's whole copy at A's next run.
- The same files damaged in a box's cache: fetched again from the bucket.
- On a folder home, damaged at a seeded place and in a seeded way: `sql` and `run` go on, the data
  comes back. A failing seed replays with `pytest tests/e2e/test_review_heal_bucket.py -k "seed-N"`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets
from sparkbatch_dagster.home import open_home
from sparkbatch_dagster.run import human_labels as hl
from testkit import make_rows, write_parquet

ROOT = Path(__file__).resolve().parents[2]
LABELS = ["fruit", "vehicle", "animal"]
KNOWS = {"apple": "fruit", "banana": "fruit", "car": "vehicle", "truck": "vehicle", "dog": "animal", "cat": "animal"}
N = 120
DEFS = f"""
import os
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource
spec = JobSpec(name="things", input=os.environ["T_INPUT"], id_column="id", text_columns=["text"],
               user_template="What is this? {{{{ text }}}}", shard_count=2, gold_column="gold",
               home=os.environ["T_HOME"], cache_dir=os.environ.get("T_CACHE"),
               output=OutputSpec(kind="label", labels={LABELS!r}), review={{"budget": 0.1}})
job = build_batch_assets(spec=spec)
defs = Definitions(assets=job.assets, resources={{"vllm": FakeVLLMResource(knows={KNOWS!r})}})
"""
#: What a reader sees, in one SELECT (each `sql` is a process): the counts (rows, reviewed, calibrated),
#: every row's label, reviewer and calibrated confidence, the label distribution and the queue.
VIEWS = ("SELECT (SELECT [count(*), count(reviewed_by), count(*) FILTER (WHERE confidence <> raw_confidence)] "
         "FROM labeled) AS counts, "
         "(SELECT list([row_id, output, reviewed_by, round(confidence, 6)::VARCHAR] ORDER BY row_id) FROM labeled) "
         "AS rows, (SELECT list([label, rows::VARCHAR]) FROM label_distribution) AS distribution, "
         "(SELECT list(row_id ORDER BY row_id) FROM review) AS queue")
QUEUE = "SELECT row_id FROM review ORDER BY row_id"
COUNTS = "SELECT count(*), count(reviewed_by) FROM labeled"


class Boxes:
    """One job definition run from several boxes (a cache folder and a DAGSTER_HOME each)."""

    def __init__(self, tmp: Path, home: str, server: Any = None) -> None:
        self.tmp, self.home, self.server = tmp, home, server
        self.input = write_parquet(tmp / "in" / "rows.parquet", make_rows(N))
        self.defs = tmp / "defs.py"
        self.defs.write_text(DEFS)

    def cache(self, box: str) -> Path:
        return self.tmp / box / "cache"

    def cli(self, box: str, *args: str) -> tuple[dict[str, Any], str]:
        (self.tmp / box / "dagster").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "T_INPUT": str(self.input), "T_HOME": self.home, "T_CACHE": str(self.cache(box)),
               "DAGSTER_HOME": str(self.tmp / box / "dagster"), "PYTHONPATH": str(ROOT)}
        env.pop("SPARKBATCH_FAILPOINT", None)
        if self.server is not None:
            env.update({**self.server.env(), "AWS_ENDPOINT_URL": self.server.endpoint_url})
        proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", args[0], "-f", str(self.defs),
                               *args[1:]], env=env, cwd=self.tmp / box, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        return json.loads(proc.stdout.splitlines()[-1]), proc.stderr

    def views(self, box: str) -> tuple[dict[str, Any], str]:
        """What ``box`` reads (:data:`VIEWS`), by name, and what it said on stderr."""
        out, err = self.cli(box, "sql", VIEWS)
        return dict(zip(out["columns"], out["rows"][0], strict=True)), err


def review_queue(boxes: Boxes, box: str, home: Any) -> list[hl.HumanLabel]:
    """Box ``box``'s reviewers label its queue (the gold label; the first row called another on
    purpose), imported into ``home`` (that box's copy of the store). Returns the labels."""
    queued = [r for [r] in boxes.cli(box, "sql", QUEUE)[0]["rows"]]
    gold = {r["id"]: r["gold"] for r in make_rows(N)}
    said = {r: gold[r] for r in queued}
    said[queued[0]] = "animal" if gold[queued[0]] != "animal" else "fruit"
    found = [hl.HumanLabel.of(r, lab, "ann@example.com", "2026-12-07T10:00:00Z", f"label-studio:1/{i}/{i}", LABELS)
             for i, (r, lab) in enumerate(said.items())]
    assert hl.merge(home, found, LABELS).added == len(queued)
    return found


@pytest.fixture
def reviewed(tmp_path: Path, s3_bucket: str, s3_server: Any) -> tuple[Boxes, Any, int]:
    """Box A's job, run, reviewed and run again (the reviewed rows calibrated with): the boxes, A's home
    opened in this process, and how many rows were reviewed."""
    boxes = Boxes(tmp_path, f"s3://{s3_bucket}/jobs/things", s3_server)
    first, _ = boxes.cli("box-a", "run")
    assert first["rows"] == N and first["review_rows"]
    home_a = open_home(boxes.home, boxes.cache("box-a"))
    n = len(review_queue(boxes, "box-a", home_a))
    again, _ = boxes.cli("box-a", "run")
    assert again["partitions_run"] == 0
    return boxes, home_a, n


def test_a_new_box_reads_the_same_labels_calibration_and_queue(reviewed):
    boxes, _, n = reviewed
    seen_a, _ = boxes.views("box-a")
    total, reviewed_rows, calibrated = seen_a["counts"]
    assert (total, reviewed_rows) == (N, n) and calibrated > 0  # confidences through A's calibration
    seen_b, said = boxes.views("box-b")  # an empty cache
    assert seen_b == seen_a
    assert "left out" not in said
    # A downstream asset's read on a third box (read_outputs, as the IO manager reads): the same rows.
    spec = JobSpec(name="things", input=str(boxes.input), id_column="id", text_columns=["text"],
                   user_template="What is this? {{ text }}", shard_count=2, gold_column="gold", home=boxes.home,
                   cache_dir=str(boxes.cache("box-c")), output=OutputSpec(kind="label", labels=LABELS),
                   review={"budget": 0.1})
    table = build_batch_assets(spec=spec).read_outputs().sort_by("row_id")
    rows = table.to_pylist()
    assert [[r["row_id"], r["output"], r["reviewed_by"]] for r in rows] == [x[:3] for x in seen_a["rows"]]
    assert [r["confidence"] for r in rows] == pytest.approx([float(x[3]) for x in seen_a["rows"]], abs=2e-6)


def _objects(boxes: Boxes, under: str) -> dict[str, bytes]:
    fs = boxes.server.fs()
    fs.invalidate_cache()
    base = boxes.home.removeprefix("s3://")
    try:
        return {p.removeprefix(f"{base}/"): fs.cat_file(p) for p in fs.find(f"{base}/{under}")}
    except FileNotFoundError:
        return {}


def test_damage_in_the_bucket_is_set_aside_and_the_data_comes_back(reviewed):
    boxes, home_a, n = reviewed
    seen_a, _ = boxes.views("box-a")
    fs, base = boxes.server.fs(), boxes.home.removeprefix("s3://")
    [cal] = [k for k in _objects(boxes, "calibration") if k.endswith(".json")]
    [labels] = [k for k in _objects(boxes, "review/labels")]
    bad = {cal: b'{"method": "isotonic", "x": [0.0, 1.0], "y": [5.0, 5.0]', "review/threshold.json": b"\x00\x01garbled",
           labels: _objects(boxes, "review/labels")[labels][:-40]}
    for key, data in bad.items():
        fs.pipe_file(f"{base}/{key}", data)
    # A new box: sql goes on, without what is damaged, saying so.
    out, err = boxes.cli("box-b", "sql", COUNTS)
    assert out["rows"][0][:2] == [N, 0] and err.count("is left out") == 3
    # Its run sets the damaged objects aside (kept), fits the calibration and the plan again, and says
    # which labels are lost until a box that holds them publishes them again.
    summary, err = boxes.cli("box-b", "run")
    assert summary["success"] and summary["calibration"] and "lost from the store" in err
    kept = {k.split(".broken-")[0]: v for k, v in _objects(boxes, "").items() if ".broken-" in k}
    assert kept == bad
    now = _objects(boxes, "")
    assert json.loads(now[cal])["method"] in ("none", "temperature", "platt", "isotonic")
    assert json.loads(now["review/threshold.json"])["target"] == 0.1 and labels not in now
    # A's next run publishes its whole copy again: every box reads every label, as before.
    _, err = boxes.cli("box-a", "run")
    assert "published again" in err
    assert _objects(boxes, labels)[labels] == (home_a.root / labels).read_bytes()
    seen_b, said = boxes.views("box-b")
    assert seen_b["counts"][1] == n and "left out" not in said
    assert seen_b == boxes.views("box-a")[0]


def test_damage_in_a_cache_is_fetched_again_from_the_bucket(reviewed):
    boxes, home_a, _ = reviewed
    seen_a, _ = boxes.views("box-a")
    cache = boxes.cache("box-a")
    [cal] = list((cache / "calibration").glob("*.json"))
    [labels] = list((cache / "review" / "labels").glob("*.parquet"))
    whole = {p: p.read_bytes() for p in (cal, labels, cache / "review" / "threshold.json")}
    cal.write_bytes(whole[cal][:30])
    labels.write_bytes(bytes(len(whole[labels])))  # its size kept: found by what it holds, not its length
    (cache / "review" / "threshold.json").write_text('{"asked": "budget", "target": 0.1, "threshold": 5.0')
    seen, said = boxes.views("box-a")
    assert seen == seen_a and "left out" not in said
    assert {p: p.read_bytes() for p in whole} == whole


#: Where a seeded damage lands, and how.
KINDS = ("calibration", "threshold", "labels")
HOW = ("truncate", "garble", "empty", "out of range")


def _damage(path: Path, how: str, rng: random.Random) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: rng.randrange(1, len(data))])
    elif how == "garble":
        at = rng.randrange(len(data))
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1:])
    elif how == "empty":
        path.write_bytes(b"")
    elif path.suffix == ".parquet":  # a tampered label: still Parquet, not what its name says
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        pq.write_table(table.set_column(1, "label", pa.array(["fruit"] * table.num_rows)), path)
    else:
        body = json.loads(data)
        if "threshold" in body:
            body["threshold"] = rng.choice([5.0, -1.0, float("nan")])
        else:
            body.update(method="isotonic", x=[0.0, 1.0], y=rng.choice([[5.0, 5.0], [0.9, 0.1]]))
        path.write_text(json.dumps(body))


# Seed 0 in make test's gate, seeds 1 and 2 (other kinds of damage, other ways) in make soak.
@pytest.mark.parametrize("seed", [pytest.param(s, id=f"seed-{s}", marks=[pytest.mark.long] if s else [])
                                  for s in range(3)])
def test_seeded_damage_on_a_folder_home_heals(tmp_path, seed):
    rng = random.Random(seed)
    kind, how = KINDS[seed % len(KINDS)], rng.choice(HOW)
    boxes = Boxes(tmp_path, str(tmp_path / "home"))
    boxes.cli("box", "run")
    home = open_home(boxes.home, tmp_path / "unused")
    found = review_queue(boxes, "box", home)
    boxes.cli("box", "run")
    before, _ = boxes.views("box")
    assert before["counts"][1] == len(found)
    path = {"calibration": next((home.root / "calibration").glob("*.json"), None),
            "threshold": home.root / "review" / "threshold.json",
            "labels": next((home.root / "review" / "labels").glob("*.parquet"), None)}[kind]
    assert path is not None and path.exists()
    whole = path.read_bytes()
    _damage(path, how, rng)
    print(f"seed {seed}: {kind} {path.name} damaged ({how}); replay: pytest {__file__} -k seed-{seed}")
    out, err = boxes.cli("box", "sql", COUNTS)  # a read goes on, leaving it out
    assert out["rows"][0][0] == N and "is left out" in err and path.exists()
    summary, err = boxes.cli("box", "run")  # the run sets it aside and the analytics makes it again
    assert summary["success"] and "set aside as" in err
    [aside] = path.parent.glob(f"{path.name}.broken-*")
    assert aside.read_bytes() != whole
    if kind == "labels":  # the reviewers' work: said lost, and an import of the same brings it back
        assert "lost from the store" in err and not path.exists()
        assert hl.merge(home, found, LABELS).path == path
        boxes.cli("box", "run")
    else:
        assert path.exists() and path.read_bytes() != aside.read_bytes()
    after, said = boxes.views("box")
    assert after == before and "left out" not in said
