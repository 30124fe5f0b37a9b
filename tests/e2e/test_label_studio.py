"""The review queue's round trip through a real Label Studio (``make label-studio``'s, on loopback,
started once for this module: tests/support/label_studio_server.py), driven by ``sparkbatch review
export`` and ``import`` on a job the fake engine labels.

Export puts each queued row in as one task (its text, the model's label as a pre-annotation with
its confidence and model); exporting again makes no duplicate; reviewers annotate through the SDK
(some agree with the model, some correct it, one skips, one changes their mind); import brings the
finished ones back as human labels with who and when; importing again changes nothing; an export
after that leaves the reviewed rows out. Expected values come from the job's own files, the review
view and Label Studio's answers, never from the code under test.

Without the server's virtualenv the module is skipped, except under ``make`` (``make test``
installs it first) or with ``SPARKBATCH_REQUIRE_LABEL_STUDIO=1``: then it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pyarrow.parquet as pq
import pytest

from label_studio_server import LS_VENV, LabelStudioServer, docs_command, installed
from sparkbatch_dagster.cli.locate import load
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.review.label_studio import put_queue, tasks_by_row
from sparkbatch_dagster.review.queue import QueueRow
from sparkbatch_dagster.run import human_labels
from sparkbatch_dagster.run.human_labels import utc_iso
from sparkbatch_dagster.run.query import read_only
from testkit import LABELS, OWNER_ENV, make_spec

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = "MAKELEVEL" in os.environ or os.environ.get("SPARKBATCH_REQUIRE_LABEL_STUDIO") == "1"
DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource
spec = JobSpec(name="things_review", input={src!r}, id_column="id", text_columns=["text"],
               user_template="What is this? {{{{ text }}}}", shard_count=2, gold_column="gold", home={home!r},
               output=OutputSpec(kind="label", labels={labels!r}), review_below=1.0)
job = build_batch_assets(spec=spec)
defs = Definitions(assets=job.assets, resources={{"vllm": FakeVLLMResource()}})
"""


@pytest.fixture(scope="module")
def label_studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabelStudioServer]:
    if not installed():
        why = "Label Studio's virtualenv (.ls-venv) is not installed: run `make label-studio`"
        if REQUIRED:
            pytest.fail(why)
        pytest.skip(why)
    with LabelStudioServer.start(tmp_path_factory.mktemp("label-studio"), drop_env=(OWNER_ENV,)) as server:
        yield server


def _client(ls: LabelStudioServer) -> Any:
    from label_studio_sdk import LabelStudio

    return LabelStudio(base_url=ls.url, api_key=ls.token)


def _cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None, ok: bool = True) -> Any:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", *args], cwd=tmp_path, env=full,
                          capture_output=True, text=True, timeout=300)
    if not ok:
        return proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _labeled_job(tmp_path: Path) -> tuple[Path, Any]:
    """A labeled job's definitions file and spec (60 rows, 2 shards, the fake engine)."""
    src = make_spec(tmp_path, n=60).input
    defs = tmp_path / "defs.py"
    defs.write_text(DEFS.format(src=src, home=str(tmp_path / "home"), labels=LABELS))
    _cli(tmp_path, "run", "-f", str(defs))
    job, _ = load(str(defs), None)
    return defs, job.spec


def _queue(spec: Any) -> dict[str, tuple[str, float, str]]:
    """The review view's rows: row_id -> (output, confidence, model)."""
    home = JobHome(spec.home_path)
    version = json.loads(home.current_path.read_text())["version"]
    with read_only(spec, home, version) as con:
        rows = con.execute("SELECT row_id, output, confidence, model FROM review").fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def _choice(label: str) -> list[dict[str, Any]]:
    return [{"from_name": "label", "to_name": "text", "type": "choices", "value": {"choices": [label]}}]


def test_the_server_runs_the_command_the_docs_give_from_the_venv_make_built(label_studio):
    """docs/labels.md's own command started this server (a wrong command or a broken install fails
    here, not a reader), and the server that answers is the one the lock pins (1.23.2)."""
    env, argv = docs_command()
    assert argv[:2] == [str(LS_VENV / "bin" / "label-studio"), "start"], argv
    assert {"LABEL_STUDIO_USERNAME", "LABEL_STUDIO_PASSWORD"} <= env.keys()
    started = label_studio.proc.args
    assert started[started.index("-c") + 2:][:len(argv)] == argv, started
    ask = urllib.request.Request(f"{label_studio.url}/api/version",
                                 headers={"Authorization": f"Token {label_studio.token}"})
    with urllib.request.urlopen(ask, timeout=10) as r:
        version = json.loads(r.read())
    assert version["release"] == "1.23.2", version


def test_the_docs_command_is_read_from_the_install_block_and_its_absence_named(tmp_path):
    docs = tmp_path / "labels.md"
    docs.write_text("Intro\n\n```bash\nmake label-studio\nA=1 B='x y' .ls-venv/bin/label-studio start --no-browser"
                    " --x=1\n```\n")
    assert docs_command(docs) == ({"A": "1", "B": "x y"}, [str(LS_VENV / "bin" / "label-studio"), "start",
                                                          "--no-browser", "--x=1"])
    docs.write_text("```bash\nmake label-studio\n```\n")
    with pytest.raises(AssertionError, match="no ```bash block with `make label-studio`"):
        docs_command(docs)


def test_review_round_trip_through_label_studio(tmp_path, label_studio):
    defs, spec = _labeled_job(tmp_path)
    env = {"LABEL_STUDIO_URL": label_studio.url, "LABEL_STUDIO_API_KEY": label_studio.token}
    queue = _queue(spec)
    assert len(queue) >= 10  # review_below=1: whatever the calibration, most rows are queued
    text = {r["id"]: r["text"] for r in pq.read_table(spec.input).to_pylist()}
    gold = {r["id"]: r["gold"] for r in pq.read_table(spec.input).to_pylist()}

    first = _cli(tmp_path, "review", "export", "-f", str(defs), env=env)
    assert first["project"] == "things_review" and first["project_created"] is True
    assert (first["queue_rows"], first["created"], first["updated"], first["unchanged"]) == \
        (len(queue), len(queue), 0, 0)
    client = _client(label_studio)
    tasks = tasks_by_row(client, first["project_id"])
    assert set(tasks) == set(queue)
    for row_id, task in tasks.items():
        output, confidence, model = queue[row_id]
        assert task["data"] == {"row_id": row_id, "text": text[row_id]}
        (pred,) = task["predictions"]
        assert pred["result"] == _choice(output) and pred["model_version"] == model
        assert pred["score"] == pytest.approx(confidence, abs=1e-6)

    again = _cli(tmp_path, "review", "export", "-f", str(defs), env=env)
    assert (again["project_id"], again["project_created"]) == (first["project_id"], False)
    assert (again["created"], again["updated"], again["unchanged"]) == (0, 0, len(queue))
    assert len(list(client.tasks.list(project=first["project_id"]))) == len(queue)  # no duplicate task

    # Reviewers at work: ann agrees with the model on some rows, bob corrects others (to the gold
    # label, or another where the model had it right), one task is skipped, one annotated twice.
    ann = client.users.create(username="ann", email="ann@example.com", password="ann-password-1")
    bob = client.users.create(username="bob", email="bob@example.com", password="bob-password-1")
    ids = sorted(queue)
    agree, correct, skipped, twice = ids[0:3], ids[3:6], ids[6], ids[7]
    said: dict[str, tuple[str, str]] = {}
    for row_id in agree:
        client.annotations.create(tasks[row_id]["id"], result=_choice(queue[row_id][0]), completed_by=ann.id)
        said[row_id] = (queue[row_id][0], "ann@example.com")
    for row_id in correct:
        fixed = gold[row_id] if gold[row_id] != queue[row_id][0] else next(x for x in LABELS if x != gold[row_id])
        client.annotations.create(tasks[row_id]["id"], result=_choice(fixed), completed_by=bob.id)
        said[row_id] = (fixed, "bob@example.com")
    client.annotations.create(tasks[skipped]["id"], result=[], was_cancelled=True, completed_by=ann.id)
    client.annotations.create(tasks[twice]["id"], result=_choice(LABELS[0]), completed_by=ann.id)
    client.annotations.create(tasks[twice]["id"], result=_choice(LABELS[1]), completed_by=bob.id)
    said[twice] = (LABELS[1], "bob@example.com")

    got = _cli(tmp_path, "review", "import", "-f", str(defs), env=env)
    assert (got["annotated"], got["cancelled"], got["added"], got["changed"], got["unchanged"]) == (7, 1, 7, 0, 0)
    assert got["path"] and got["human_labels"] == 7
    # The job's human_labels asset shows them in the UI; its check waits for the rest of the queue.
    has_asset = "human_labels" in load(str(defs), None)[0].keys
    assert got["materialized"] is has_asset and got.get("review_complete") is (False if has_asset else None)
    home = JobHome(spec.home_path)
    stored = human_labels.load(home, LABELS)
    assert {k: (v.label, v.reviewer) for k, v in stored.items()} == said
    annotations = {r: max(client.tasks.get(str(tasks[r]["id"])).model_dump(mode="json")["annotations"],
                          key=lambda a: a["id"]) for r in said}
    for row_id, h in stored.items():
        a = annotations[row_id]
        assert h.reviewed_at == utc_iso(a["updated_at"])
        assert h.source == f"label-studio:{first['project_id']}/{tasks[row_id]['id']}/{a['id']}"

    files = sorted(human_labels.labels_folder(home).glob("*.parquet"))
    second = _cli(tmp_path, "review", "import", "-f", str(defs), env=env)
    assert (second["added"], second["changed"], second["unchanged"], second["path"]) == (0, 0, 7, None)
    assert second["materialized"] is False  # nothing new: no run
    assert sorted(human_labels.labels_folder(home).glob("*.parquet")) == files  # importing twice changes nothing
    assert human_labels.load(home, LABELS) == stored

    # The rows reviewed are not exported again; the others' predictions follow the model's answer,
    # whose confidence the corrected rows may have recalibrated (they are gold now).
    third = _cli(tmp_path, "review", "export", "-f", str(defs), env=env)
    now = _queue(spec)
    left = set(now) - set(stored)
    moved = {r for r in left if (now[r][0], round(now[r][1], 6), now[r][2]) != (queue[r][0], round(queue[r][1], 6),
                                                                               queue[r][2])}
    assert third["reviewed"] == len(stored)  # every labeled row was queued: counted, not sent again
    assert skipped in now  # a skip alone is "not now": the row stays queued
    assert (third["queue_rows"], third["created"], third["updated"], third["unchanged"]) == \
        (len(left), 0, len(moved), len(left) - len(moved))
    tasks = tasks_by_row(client, first["project_id"])
    assert len(tasks) == len(queue) == len(list(client.tasks.list(project=first["project_id"])))
    for row_id in left:
        (pred,) = tasks[row_id]["predictions"]
        assert pred["result"] == _choice(now[row_id][0]) and pred["score"] == pytest.approx(now[row_id][1], abs=1e-6)

    # A reviewer who changes an annotation later: the next import changes that row.
    client.annotations.update(annotations[agree[0]]["id"], result=_choice(LABELS[2]))
    changed = _cli(tmp_path, "review", "import", "-f", str(defs), env=env)
    assert (changed["added"], changed["changed"], changed["unchanged"]) == (0, 1, 6)
    assert human_labels.load(home, LABELS)[agree[0]].label == LABELS[2]
    # --dismiss-skipped: the skipped row leaves the queue, said in the line
    dismissed = _cli(tmp_path, "review", "import", "-f", str(defs), "--dismiss-skipped", env=env)
    assert dismissed["dismissed"] == 1 and skipped not in _queue(spec)


def test_a_changed_model_answer_updates_the_tasks_prediction(tmp_path, label_studio):
    client = _client(label_studio)
    project = client.projects.create(title="prediction-update", label_config=(
        '<View><Text name="text" value="$text"/><Choices name="label" toName="text" choice="single">'
        + "".join(f'<Choice value="{x}"/>' for x in LABELS) + "</Choices></View>"))
    rows = [QueueRow("r1", "fruit", 0.31, "model-a", {"text": "A cherry."}),
            QueueRow("r2", "animal", 0.12, "model-a", {"text": "A dog."})]
    assert put_queue(client, project.id, rows, "text") == (2, 0, 0)
    moved = [rows[0], QueueRow("r2", "vehicle", 0.44, "model-b", {"text": "A dog."})]
    assert put_queue(client, project.id, moved, "text") == (0, 1, 1)
    tasks = tasks_by_row(client, project.id)
    assert len(tasks) == 2
    (pred,) = tasks["r2"]["predictions"]
    assert (pred["result"], pred["model_version"]) == (_choice("vehicle"), "model-b")
    assert pred["score"] == pytest.approx(0.44)


def test_flags_and_errors_are_one_line_naming_the_fix(tmp_path, label_studio):
    defs, _ = _labeled_job(tmp_path)
    bare = {k: "" for k in ("LABEL_STUDIO_URL", "LABEL_STUDIO_API_KEY")}
    proc = _cli(tmp_path, "review", "export", "-f", str(defs), env=bare, ok=False)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip() == ("sparkbatch: no Label Studio address: pass --url or set LABEL_STUDIO_URL "
                                   "(e.g. http://localhost:8080)")
    proc = _cli(tmp_path, "review", "import", "-f", str(defs), "--url", label_studio.url, env=bare, ok=False)
    assert "pass --api-key or set LABEL_STUDIO_API_KEY" in proc.stderr and len(proc.stderr.splitlines()) == 1
    proc = _cli(tmp_path, "review", "export", "-f", str(defs), "--url", label_studio.url, "--api-key", "wrong",
                env=bare, ok=False)
    assert proc.stderr.startswith(f"sparkbatch: Label Studio at {label_studio.url} refused the API key (401)")
    proc = _cli(tmp_path, "review", "import", "-f", str(defs), "--url", label_studio.url, "--api-key",
                label_studio.token, "--project", "no-such-project", env=bare, ok=False)
    assert "has no project titled 'no-such-project'" in proc.stderr and len(proc.stderr.splitlines()) == 1
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "defs.py").write_text(DEFS.format(src=make_spec(fresh, n=20).input, home=str(fresh / "home"),
                                               labels=LABELS))
    proc = _cli(fresh, "review", "export", "-f", str(fresh / "defs.py"), "--url", label_studio.url, "--api-key",
                label_studio.token, env=bare, ok=False)
    assert "has no shards yet: materialize things_review/input_shards first" in proc.stderr  # nothing run yet
    assert len(proc.stderr.splitlines()) == 1
    # The flags win over the environment.
    flags = _cli(tmp_path, "review", "export", "-f", str(defs), "--url", label_studio.url, "--api-key",
                 label_studio.token, "--project", "flags-project", "--limit", "3", env=bare)
    assert (flags["project"], flags["queue_rows"], flags["created"]) == ("flags-project", 3, 3)


def test_a_personal_access_token_is_an_api_key_and_a_revoked_one_is_refused(tmp_path, label_studio):
    """Label Studio's own kind of API key (a personal access token: a JWT refresh token the SDK trades
    for short-lived access tokens, what Account & Settings hands out unless the organization allows
    legacy tokens): export and import take it; once revoked or expired, they stop in one line naming
    the fix."""
    defs, _ = _labeled_job(tmp_path)
    personal = _client(label_studio).tokens.create().token
    assert personal.count(".") == 2 and personal != label_studio.token  # a JWT, not the legacy token
    env = {"LABEL_STUDIO_URL": label_studio.url, "LABEL_STUDIO_API_KEY": personal}
    sent = _cli(tmp_path, "review", "export", "-f", str(defs), "--project", "personal-token", env=env)
    assert sent["created"] == sent["queue_rows"] > 0 and sent["project_created"]
    back = _cli(tmp_path, "review", "import", "-f", str(defs), "--project", "personal-token", env=env)
    assert (back["added"], back["changed"]) == (0, 0)  # nothing annotated yet: read, nothing written
    _client(label_studio).tokens.blacklist(refresh=personal)
    # ...and one past its expiry, which the SDK refuses before it asks the server.
    expired = jwt.encode({"token_type": "refresh", "exp": 1}, "not-the-server-key", algorithm="HS256")
    for command, key in (("export", personal), ("import", personal), ("export", expired)):
        proc = _cli(tmp_path, "review", command, "-f", str(defs), "--project", "personal-token",
                    env={**env, "LABEL_STUDIO_API_KEY": key}, ok=False)
        assert proc.returncode != 0 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith(f"sparkbatch: Label Studio at {label_studio.url} refused the API key (40")
        assert "personal access token" in proc.stderr
