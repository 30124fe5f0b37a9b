"""What a run writes on a row beside the model's answer: its calibrated confidence, and the
reviewer's label where a person has already said what the row is.

A run loads both once, when it opens a shard (:meth:`Marks.of`): the calibrations stored for the job's
label set (one per model identity: a cascade's rows come from several) and the human labels imported
from the annotation tool. Each row then goes through :meth:`Marks.apply` on its way to the checkpoint:

- ``confidence`` becomes the model's calibrated one, ``raw_confidence`` keeps what the model said;
- where a reviewer labeled the row, ``output`` is the reviewer's label (an answer taken from the
  result store included: the store never hands the model's old answer back over a human one), and
  ``model_output``, ``reviewed_by``, ``reviewed_at`` keep the model's answer, who and when.

The result store keeps the model's own answers (``open_shard.new_answers``): never a reviewer's
label under a model's name, never a calibrated confidence.

Example::

    marks = Marks.of(spec, home)
    writer.add(marks.apply(row(rid, version, answer)))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..home import JobHome
from ..spec import JobSpec
from . import human_labels
from .calibration_map import Calibration, stored
from .records import OutputRow
from .review_store import heal


@dataclass(frozen=True)
class Marks:
    """The calibrations (by model identity) and the human labels (by row id) a run writes rows with."""

    calibrations: dict[str, Calibration] = field(default_factory=dict)
    human: dict[str, human_labels.HumanLabel] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: JobSpec, home: JobHome) -> Marks:
        """What the job's home holds now, for ``spec``'s label set (the cache of a bucket home:
        :func:`pull` first)."""
        labels = job_labels(spec)
        return cls(calibrations=stored(home.calibration_dir, labels), human=human_labels.load(home, labels))

    def apply(self, out: OutputRow) -> OutputRow:
        """``out`` with its confidence calibrated and a reviewer's label over the model's."""
        changes: dict[str, object] = {}
        if out.confidence is not None and out.raw_confidence is None:
            cal = self.calibrations.get(out.model)
            changes.update(raw_confidence=out.confidence, confidence=cal.one(out.confidence) if cal else out.confidence)
        seen = self.human.get(out.row_id)
        if seen is not None:
            changes.update(output=seen.label, error=None, model_output=out.output, reviewed_by=seen.reviewer,
                           reviewed_at=seen.reviewed_at)
        return msgspec.structs.replace(out, **changes) if changes else out


def marked(table: Any, marks: Marks) -> Any:
    """Committed output rows (a pyarrow Table of ``OUTPUT_SCHEMA``) as the ``labeled`` view shows them,
    for readers that take the files (``BatchJob.read_outputs``, the IO manager): the confidence by the
    newest calibration of the model's own (``raw_confidence``), the newest reviewer's label over the
    model's answer (``model_output`` keeps the model's; ``reviewed_by``, ``reviewed_at``: who and when)."""
    import pyarrow as pa

    if not marks.calibrations and not marks.human:
        return table
    cols = {n: table.column(n).to_pylist() for n in ("row_id", "output", "error", "confidence", "raw_confidence",
                                                       "model", "model_output", "reviewed_by", "reviewed_at")}
    for i, rid in enumerate(cols["row_id"]):
        raw = cols["raw_confidence"][i] if cols["raw_confidence"][i] is not None else cols["confidence"][i]
        cal = marks.calibrations.get(cols["model"][i])
        if raw is not None:
            cols["raw_confidence"][i], cols["confidence"][i] = raw, cal.one(raw) if cal else raw
        seen = marks.human.get(rid)
        if seen is not None:
            if cols["reviewed_by"][i] is None:  # else a run wrote a reviewer's label: model_output is the model's
                cols["model_output"][i] = cols["output"][i]
            cols["output"][i], cols["error"][i] = seen.label, None
            cols["reviewed_by"][i], cols["reviewed_at"][i] = seen.reviewer, seen.reviewed_at
    for name, values in cols.items():
        table = table.set_column(table.schema.get_field_index(name), name,
                                 pa.array(values, table.schema.field(name).type))
    return table


def pull(home: JobHome) -> None:
    """For a writer (a run, the review assets): bring into the cache what another box learnt or
    imported (the calibrations, the review threshold and the human labels, each published when
    written; a folder home has them already), then set aside what is damaged (:mod:`.review_store`)."""
    home.pull_review()
    heal(home)


def job_labels(spec: JobSpec) -> list[str]:
    """The label set calibrations and human labels are kept under: the job's labels ([] for JSON)."""
    return list(spec.output.labels or [])
