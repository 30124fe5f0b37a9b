"""``sparkbatch review import``: a Label Studio project's finished annotations read back as the job's
human labels (:mod:`.label_studio` has the export and the connection both share).

Cancelled and skipped annotations are left out, the latest per task counts; a skip keeps the row
queued ("not now") unless ``--dismiss-skipped`` says the skipped rows need no label. Annotations are
merged into the job's store: importing again changes nothing. A label outside the job's label set
refuses the whole import, naming every such row (how many, the first five).

Example::

    import_review(job, Server("http://localhost:8080", "token"))             # ImportResult(added=37, ...)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import SparkbatchError
from ..run import human_labels
from ..run.human_labels import HumanLabel
from .label_studio import FROM_NAME, Server, connect, find_project, project_title, talking, tasks_by_row


@dataclass(frozen=True)
class ImportResult:
    """What an import did: finished annotations read (``annotated``), tasks left out (``cancelled``:
    skipped or cancelled, their rows still queued unless ``dismissed``; ``empty``: no choice), and the
    merge (``added``, ``changed``, ``unchanged``, the file written or None); ``human_labels``: the rows
    the store labels now."""

    project_id: int
    project: str
    annotated: int
    cancelled: int
    empty: int
    added: int
    changed: int
    unchanged: int
    path: str | None
    human_labels: int
    #: Skipped tasks' rows taken out of the review queue (``--dismiss-skipped``); 0 without it.
    dismissed: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def reviewers(client: Any) -> dict[int, str]:
    """Each Label Studio user id's name as a reviewer: the email, else the username."""
    return {u.id: u.email or u.username or f"user-{u.id}" for u in client.users.list()}


def finished(task: dict[str, Any]) -> dict[str, Any] | None:
    """The task's latest annotation that is not cancelled (skipped), or None."""
    done = [a for a in task.get("annotations") or [] if not a.get("was_cancelled")]
    return max(done, key=lambda a: (a.get("updated_at") or "", a.get("id") or 0)) if done else None


def picked(annotation: dict[str, Any]) -> str | None:
    """The label an annotation chose in the ``label`` Choices, or None."""
    for item in annotation.get("result") or []:
        if item.get("from_name") == FROM_NAME and item.get("type") == "choices":
            chosen = (item.get("value") or {}).get("choices") or []
            return str(chosen[0]) if chosen else None
    return None


def read_annotations(client: Any, project_id: int,
                     labels: Sequence[str]) -> tuple[list[HumanLabel], list[str], int]:
    """The project's finished annotations as human labels, the rows of tasks whose every annotation
    was cancelled or skipped, and the count of annotations that chose nothing."""
    names = reviewers(client)
    found: list[HumanLabel] = []
    cancelled: list[str] = []
    empty = 0
    for row_id, task in tasks_by_row(client, project_id).items():
        if not task.get("annotations"):
            continue
        last = finished(task)
        label = picked(last) if last is not None else None
        if last is None or label is None:
            if last is None:
                cancelled.append(row_id)
            empty += last is not None
            continue
        who = last.get("completed_by")
        uid = int((who.get("id") if isinstance(who, dict) else who) or 0)
        found.append(HumanLabel.of(row_id, label, names.get(uid, f"user-{uid}"),
                                   str(last.get("updated_at") or last.get("created_at")),
                                   f"label-studio:{project_id}/{task['id']}/{last['id']}", labels))
    return found, cancelled, empty


def outside(found: Sequence[HumanLabel], labels: Sequence[str], show: int = 5) -> str:
    """Every annotation whose label is not one of ``labels``, in one line (the count and the first
    ``show`` rows), or '' when there is none: a label set changed since the export names them all."""
    allowed = set(labels)
    bad = [h for h in found if h.label not in allowed]
    if not bad:
        return ""
    first = ", ".join(f"row {h.row_id!r}: {h.label!r} ({h.source})" for h in bad[:show])
    more = f" and {len(bad) - show} more" if len(bad) > show else ""
    return (f"{len(bad)} annotation(s) chose a label that is not one of the job's labels {sorted(allowed)}: {first}"
            f"{more}: correct them in Label Studio, or add the labels to output.labels; nothing was imported")


def merge_annotations(client: Any, home: Any, project: Any, labels: Sequence[str],
                      dismiss_skipped: bool = False) -> ImportResult:
    """Read ``project``'s finished annotations and merge them into ``home``'s human labels; with
    ``dismiss_skipped``, the rows whose tasks were skipped leave the review queue (dismissed)."""
    from ..run import review_members

    found, cancelled, empty = read_annotations(client, project.id, labels)
    bad = outside(found, labels)
    if bad:
        raise SparkbatchError(bad)
    done = human_labels.merge(home, found, labels)
    dismissed = 0
    if dismiss_skipped and cancelled:
        home.pull_review()  # the rows other boxes queued and dismissed, so only new dismissals are written
        review_members.remember(home, cancelled, "dismissed", by=f"label-studio:{project.id}", note="skipped")
        dismissed = len(cancelled)
    return ImportResult(project_id=project.id, project=project.title, annotated=len(found), cancelled=len(cancelled),
                        empty=empty, added=done.added, changed=done.changed, unchanged=done.unchanged,
                        path=str(done.path) if done.path else None,
                        human_labels=len(human_labels.load(home, labels)), dismissed=dismissed)


def import_review(job: Any, server: Server, project: str | None = None,
                  dismiss_skipped: bool = False) -> ImportResult:
    """Merge the finished annotations of the project titled ``project`` (default: the job's name)
    into ``job``'s human labels (``dismiss_skipped``: a skipped task's row leaves the review queue);
    a project that is not there is refused, naming it."""
    labels = list(job.spec.output.labels or [])
    title = project or job.spec.name
    client = connect(server)
    with talking(server):
        found = find_project(client, project_title(title))
        if found is None:
            raise SparkbatchError(f"Label Studio at {server.url} has no project titled {title!r}: `sparkbatch review "
                                  "export` makes it, or name the project with --project")
        return merge_annotations(client, job.home, found, labels, dismiss_skipped)
