"""The review queue's round trip through Label Studio, with its SDK (``label-studio-sdk``):
``sparkbatch review export`` and ``sparkbatch review import`` (:mod:`..cli.review` reads the arguments).

:func:`export_review` creates (or finds, by title: the job's name unless given) a project whose
labeling config is a choice over the job's labels beside the row's text columns, and puts the review
queue in as tasks, one per row (``data``: ``row_id`` and the text fields), the model's label as a
pre-annotation with its confidence as score and the model as ``model_version``. Tasks are keyed by
``row_id``: exporting again creates no duplicate (a task whose model answer changed gets its
prediction updated), and rows a reviewer already labeled are not sent again.

:func:`~.label_studio_import.import_review` reads the annotations back (:mod:`.label_studio_import`).

Example::

    export_review(job, resource, Server("http://localhost:8080", "token"))   # ExportResult(created=120, ...)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import quoteattr

from ..errors import SparkbatchError
from .queue import QueueRow, text_keys

#: The labeling config's Choices tag: the name every prediction and annotation result carries.
FROM_NAME = "label"
#: Label Studio's bounds on a project title.
TITLE_LEN = (3, 50)


@dataclass(frozen=True)
class Server:
    """Where Label Studio answers, and the API key (a user's access token) it takes."""

    url: str
    api_key: str


@dataclass(frozen=True)
class ExportResult:
    """What an export did: tasks ``created``, ``updated`` (the model's answer changed) and
    ``unchanged``; ``reviewed``: queued rows left out because a reviewer already labeled them."""

    project_id: int
    project: str
    project_created: bool
    queue_rows: int
    reviewed: int
    created: int
    updated: int
    unchanged: int
    url: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def connect(server: Server) -> Any:
    """A Label Studio SDK client (``label_studio_sdk.LabelStudio``) for ``server``."""
    try:
        from label_studio_sdk import LabelStudio
    except ImportError:
        raise SparkbatchError("`sparkbatch review` needs label-studio-sdk, which this environment lacks: `make "
                              "install` adds it (pip install --no-deps label-studio-sdk==2.1.2, see the Makefile)") \
            from None
    with talking(server):  # a personal access token is checked here: an expired one is refused at once
        return LabelStudio(base_url=server.url.rstrip("/"), api_key=server.api_key)


@contextmanager
def talking(server: Server) -> Iterator[None]:
    """Label Studio's failures as one line naming the server and the fix."""
    import httpx
    from label_studio_sdk.core.api_error import ApiError  # connect() came first: the SDK is there

    try:
        yield
    except httpx.HTTPError as exc:
        raise SparkbatchError(f"cannot reach Label Studio at {server.url} ({type(exc).__name__}: {exc}): start it "
                              "(`label-studio start`) or pass --url / set LABEL_STUDIO_URL") from None
    except ApiError as exc:
        status = getattr(exc, "status_code", None)
        if status in (401, 403):
            raise SparkbatchError(f"Label Studio at {server.url} refused the API key ({status}): pass a personal "
                                  "access token (Account & Settings; a legacy token works where the organization "
                                  "allows them) with --api-key or LABEL_STUDIO_API_KEY") from None
        raise SparkbatchError(f"Label Studio at {server.url} answered {status}: {getattr(exc, 'body', exc)}") \
            from None


def label_config(labels: Sequence[str], text_columns: Sequence[str]) -> str:
    """The labeling config: each text column shown under its name, then one choice over ``labels``."""
    parts = ["<View>"]
    for column, key in text_keys(text_columns):
        # A Header's value starting with "$" would be read as a data variable.
        parts.append(f"<Header value={quoteattr(key if column.startswith('$') else column)}/>")
        parts.append(f"<Text name={quoteattr(key)} value={quoteattr('$' + key)}/>")
    first = text_keys(text_columns)[0][1]
    parts.append(f'<Choices name="{FROM_NAME}" toName={quoteattr(first)} choice="single" showInline="true">')
    parts += [f"<Choice value={quoteattr(label)}/>" for label in labels]
    parts += ["</Choices>", "</View>"]
    return "".join(parts)


def _same_config(a: str | None, b: str) -> bool:
    squeeze = lambda s: re.sub(r">\s+<", "><", s or "").strip()  # noqa: E731
    return squeeze(a) == squeeze(b)


def project_title(title: str) -> str:
    low, high = TITLE_LEN
    if not low <= len(title) <= high:
        raise SparkbatchError(f"Label Studio project title {title!r} must be {low} to {high} characters: name one "
                              "with --project")
    return title


def find_project(client: Any, title: str) -> Any | None:
    """The project titled exactly ``title``, None if none is; two are refused, naming their ids."""
    found = [p for p in client.projects.list(title=title) if p.title == title]
    if len(found) > 1:
        raise SparkbatchError(f"Label Studio has {len(found)} projects titled {title!r} (ids "
                              f"{sorted(p.id for p in found)}): rename all but one, or export to another title "
                              "with --project")
    return found[0] if found else None


def ensure_project(client: Any, title: str, config: str) -> tuple[Any, bool]:
    """The project titled ``title`` with ``config``: found (its config brought up to date) or created."""
    project = find_project(client, project_title(title))
    if project is None:
        return client.projects.create(title=title, label_config=config,
                                      description="The review queue of sparkbatch job; `sparkbatch review "
                                                  "import` reads the finished annotations back."), True
    if not _same_config(getattr(project, "label_config", None), config):
        client.projects.update(project.id, label_config=config)
    return project, False


def choice(label: str, to_name: str) -> list[dict[str, Any]]:
    """A Choices result (a prediction's or an annotation's) picking ``label``."""
    return [{"from_name": FROM_NAME, "to_name": to_name, "type": "choices", "value": {"choices": [label]}}]


def prediction(row: QueueRow, to_name: str) -> dict[str, Any]:
    """The model's answer as a Label Studio prediction: its label, confidence and model."""
    return {"result": choice(row.output, to_name), "score": row.score, "model_version": row.model}


def _same_prediction(found: dict[str, Any], want: dict[str, Any]) -> bool:
    score = found.get("score")
    return (found.get("result") == want["result"] and found.get("model_version") == want["model_version"]
            and score is not None and abs(float(score) - want["score"]) < 1e-9)


def tasks_by_row(client: Any, project_id: int) -> dict[str, dict[str, Any]]:
    """The project's tasks with their predictions and annotations, by ``row_id`` (tasks without one,
    made by hand in Label Studio, are not the queue's and are left out)."""
    out: dict[str, dict[str, Any]] = {}
    for task in client.tasks.list(project=project_id, fields="all"):
        t = task.model_dump(mode="json") if hasattr(task, "model_dump") else dict(task)
        row_id = (t.get("data") or {}).get("row_id")
        if row_id is not None:
            out.setdefault(str(row_id), t)  # the first of any duplicates made outside sparkbatch
    return out


def put_queue(client: Any, project_id: int, queue: Sequence[QueueRow], to_name: str) -> tuple[int, int, int]:
    """The queue's rows as the project's tasks: (created, updated, unchanged)."""
    have = tasks_by_row(client, project_id)
    new = [{"data": row.data(), "predictions": [prediction(row, to_name)]} for row in queue if row.row_id not in have]
    updated = unchanged = 0
    for row in (r for r in queue if r.row_id in have):
        want, found = prediction(row, to_name), have[row.row_id].get("predictions") or []
        if any(_same_prediction(p, want) for p in found):
            unchanged += 1
            continue
        if found:
            client.predictions.update(max(found, key=lambda p: p["id"])["id"], **want)
        else:
            client.predictions.create(task=have[row.row_id]["id"], **want)
        updated += 1
    if new:
        client.projects.import_tasks(project_id, request=new)
    return len(new), updated, unchanged


def export_review(job: Any, resource: Any, server: Server, project: str | None = None,
                  limit: int | None = None) -> ExportResult:
    """Put ``job``'s review queue (its first ``limit`` rows not yet reviewed) into the Label Studio
    project titled ``project`` (default: the job's name), creating it if needed."""
    from ..run import review_members
    from .queue import read_queue, save_export

    labels = list(job.spec.output.labels or [])
    if job.spec.output.kind != "label" or not labels:
        raise SparkbatchError(f"job {job.spec.name!r} has output.kind={job.spec.output.kind!r}: `sparkbatch review` "
                              "sends label jobs to Label Studio (output.kind='label' with output.labels)")
    queue, reviewed = read_queue(job, resource, labels, limit)
    client = connect(server)
    to_name = text_keys(job.spec.text_columns)[0][1]
    with talking(server):
        found, made = ensure_project(client, project or job.spec.name, label_config(labels, job.spec.text_columns))
        created, updated, unchanged = put_queue(client, found.id, queue, to_name)
    result = ExportResult(project_id=found.id, project=found.title, project_created=made, queue_rows=len(queue),
                          reviewed=reviewed, created=created, updated=updated, unchanged=unchanged,
                          url=f"{server.url.rstrip('/')}/projects/{found.id}/data")
    save_export(job.home, result.to_json(), [r.row_id for r in queue])
    # Sent to reviewers: queued for good, whatever a later cut selects (run/review_members.py).
    review_members.remember(job.home, [r.row_id for r in queue], "queued", by="sparkbatch review export")
    return result
