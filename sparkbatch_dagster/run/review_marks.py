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
        changes = self.changes(out.row_id, out.model, out.output, out.confidence, out.raw_confidence,
                               out.reviewed_by, out.model_output)
        return msgspec.structs.replace(out, **changes) if changes else out

    def changes(self, row_id: str, model: str, output: str | None, confidence: float | None,
                raw_confidence: float | None, reviewed_by: str | None, model_output: str | None) -> dict[str, Any]:
        """What marking a row changes, by field: the confidence by its model's calibration of the
        model's own (``raw_confidence``, else ``confidence``: a row a run has not marked yet); where a
        reviewer labeled the row, their label over the model's answer (``model_output`` keeps the
        model's: the row's ``output``, or its ``model_output`` when a run wrote a reviewer's label)."""
        out: dict[str, Any] = {}
        raw = raw_confidence if raw_confidence is not None else confidence
        if raw is not None:
            cal = self.calibrations.get(model)
            out.update(raw_confidence=raw, confidence=cal.one(raw) if cal else raw)
        seen = self.human.get(row_id)
        if seen is not None:
            out.update(output=seen.label, error=None, model_output=output if reviewed_by is None else model_output,
                       reviewed_by=seen.reviewer, reviewed_at=seen.reviewed_at)
        return out


#: The columns :meth:`Marks.changes` reads, in its arguments' order, and the ones it may change.
_READS = ("row_id", "model", "output", "confidence", "raw_confidence", "reviewed_by", "model_output")
_WRITES = ("output", "error", "confidence", "raw_confidence", "model_output", "reviewed_by", "reviewed_at")


def marked(table: Any, marks: Marks) -> Any:
    """Committed output rows (a pyarrow Table of ``OUTPUT_SCHEMA``) as the ``labeled`` view shows them,
    for readers that take the files (``BatchJob.read_outputs``, the IO manager): each row as a run
    would mark it now (:meth:`Marks.changes`), by the newest calibrations and reviewers' labels."""
    import pyarrow as pa

    if not marks.calibrations and not marks.human:
        return table
    cols = {n: table.column(n).to_pylist() for n in dict.fromkeys(_READS + _WRITES)}
    for i, row in enumerate(zip(*(cols[n] for n in _READS), strict=True)):
        for name, value in marks.changes(*row).items():
            cols[name][i] = value
    for name, values in ((n, cols[n]) for n in _WRITES):
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
