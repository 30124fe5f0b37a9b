"""One shard in flight in a run: its rows read and planned, its checkpoint writer, the prompts it
still has to generate, in the order they go to the engine, and what the result store answers."""

from __future__ import annotations

from typing import Any

from ..engines.base import EngineResult
from ..engines.platform.spans import Spans
from ..home import JobHome
from ..spec import JobSpec
from .attempts import Attempt
from .checkpoint import CheckpointWriter
from .records import OutputRow
from .result_store import ResultStore
from .review_marks import Marks
from .rows import STORED_ERRORS, Answer, in_prefix_order, plan_rows, read_shard, row, store_key


class OpenShard:
    """One shard in flight: its writer, its unique prompts, and how many are still out."""

    def __init__(self, spec: JobSpec, home: JobHome, version: str, model: str, key: str, signature: str | None,
                 attempt: Attempt | None, store: ResultStore, marks: Marks, spans: Spans | None = None) -> None:
        self.key, self.version, self.model = key, version, model
        spans = spans or Spans()
        with spans.span("read_shards"):
            self.rows = read_shard(home, key, signature)
        remote = home.remote
        # In a bucket every part is a PUT request (billed, and slower than a local write): parts go
        # out every checkpoint_seconds, not every checkpoint_rows, so their count follows time, not speed.
        every_rows = spec.checkpoint_rows if remote is None else 1 << 62
        tag = attempt.id.rsplit("-", 1)[-1] if remote is not None and attempt is not None else None
        self.writer = CheckpointWriter(home.parts_dir(version, key), every_rows, spec.checkpoint_seconds, tag)
        self.writer.spans = spans
        self.marks = marks  # calibrations and reviewers' labels, read once at the run's start
        if remote is not None:
            self.writer.on_part = remote.push_part
        with spans.span("resume"):
            done = set(self.writer.existing().column("row_id").to_pylist())
        self.resumed = len(done)
        with spans.span("render"):
            errors, self.groups = plan_rows(spec, self.rows, done)
            for rid, reason in errors.items():
                self._add(row(rid, version, Answer.failed(reason, model)))
        with spans.span("prompt_keys"):
            # The answer's key, or None for a draw: generated every time, never looked up nor stored.
            self.keys: dict[str, str | None] = {g: store_key(g) for g in self.groups}
        with spans.span("store_lookup"):
            self._reuse(store)
        self.order = in_prefix_order(self.groups)
        self.outstanding = len(self.order)
        self.done = len(self.rows) - sum(len(ids) for _, ids in self.groups.values())  # resumed, reused, errors
        self.pending = 0  # rows whose prompt got only transient failures: nothing written for them
        self.finished = False  # assembled and handed to its commit
        self.abandoned = False  # another box took it over: this attempt writes nothing more of it
        self.fresh_tokens = 0
        self.first_sent: float | None = None

    def record(self, res: EngineResult, spec: JobSpec) -> int:
        """Write the rows of one engine answer (``res.id``: ``"<shard>:<n>"``, the n-th prompt of
        ``order``): every row with that prompt, the first as answered and the rest as duplicates.
        A retryable failure is not the rows' fault: nothing is written and they count as pending,
        so the next run retries them. Returns the rows written."""
        group = self.order[int(res.id.partition(":")[2])]
        prompt, ids = self.groups[group]
        self.outstanding -= 1
        if res.retryable:
            self.pending += len(ids)
            return 0
        answer = Answer.of_engine(res, spec, prompt, self.keys[group], self.model)
        for i, rid in enumerate(ids):
            self._add(row(rid, self.version, answer, duplicate=i > 0))
        self.done += len(ids)
        self.fresh_tokens += res.prompt_tokens + res.output_tokens
        return len(ids)

    def _add(self, out: OutputRow) -> None:
        self.writer.add(self.marks.apply(out))

    def _reuse(self, store: ResultStore, only: list[Any] | None = None) -> int:
        """Write the rows whose answer is already stored (of ``only``'s groups, or all); they
        leave the prompts to generate. Returns the rows written."""
        keyed = {g: k for g in (list(self.groups) if only is None else only) if (k := self.keys[g]) is not None}
        found = store.lookup(list(keyed.values()))
        written = 0
        for group, key in [(g, k) for g, k in keyed.items() if k in found]:
            # The model that gave it: a cascade's stage (the store of one model holds that model's).
            answer = Answer.stored(found[key], key, self.model)
            for i, rid in enumerate(self.groups.pop(group)[1]):
                self._add(row(rid, self.version, answer, duplicate=i > 0))
                written += 1
        return written

    def reuse_unsent(self, store: ResultStore, sent: int) -> int:
        """Look the prompts not yet sent up again (another run stored answers meanwhile): the
        rows found are written, their prompts leave the order. Returns the rows written."""
        rest = self.order[sent:]
        written = self._reuse(store, rest)
        if written:
            self.order = self.order[:sent] + [g for g in rest if g in self.groups]
            self.outstanding -= len(rest) - (len(self.order) - sent)
            self.done += written
        return written

    def abandon(self, home: JobHome) -> None:
        """Stop a shard another box now owns: no more rows, parts or uploads from this attempt;
        the parts it uploaded go too (after the uploads queued before them)."""
        self.abandoned = True
        self.writer.on_part = lambda _: None
        self.writer.discard()
        if home.remote is not None and self.writer.tag:
            home.remote.drop_parts_of(home, self.version, self.key, self.writer.tag)
        self.release()

    def release(self) -> None:
        """Drop the rows once committed, so a run's memory does not grow with its shard count."""
        self.rows, self.groups, self.order, self.keys = [], {}, [], {}
        self.writer.tables.clear()


def new_answers(table: Any) -> list[dict[str, Any]]:
    """The shard's rows that the engine answered in this version (one per prompt) and that the
    same prompt would get again: what the result store keeps."""
    cols = ["prompt_key", "output", "error", "prompt_tokens", "output_tokens", "model", "reused", "deduplicated",
            "truncated", "confidence", "raw_confidence", "reasoning", "extra", "finish_reason", "reviewed_by"]
    # A cut answer is kept with its mark (the store's ``truncated``): the same prompt under the same
    # settings is cut the same, and a batch file's line is answered with it (finish_reason "length").
    # The store keeps the model's own answers: its confidence uncalibrated, and no row whose output
    # a reviewer's label replaced (the model's answer there is the row's model_output, not stored).
    return [{**{k: v for k, v in r.items() if k not in ("raw_confidence", "reviewed_by")},
             # (parts an older release wrote have no raw_confidence: their confidence is the raw one)
             "confidence": r["raw_confidence"] if r["raw_confidence"] is not None else r["confidence"]}
            for r in table.select(cols).to_pylist()
            if r["prompt_key"] and not r["reused"] and not r["deduplicated"] and r["reviewed_by"] is None
            and (r["error"] is None or r["error"].startswith(STORED_ERRORS))]
