"""Input formats, one record each: what a format is called, the file names it is told by, the first
bytes a file of it starts with, how DuckDB reads it in one go, how it is read row by row when that
fails, and what the input's signature digests of its files. Every step of sharding that differs by
format reads the record (``shards.py``, ``sources.py``, :func:`diagnose`); none compares names.

A new format is one :class:`InputFormat` in :data:`FORMATS`, its stager (and, where DuckDB reads it,
its reader) and their tests; ``input_format``'s choices in ``spec/job_spec.py`` name it. Example::

    fmt = format_of(spec)                 # the record input_format names, or the one the name tells
    staged = fmt.stage(con, spec, files, scratch)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import InputError
from ..spec import BATCH_INPUTS, JobSpec
from .arrow_input import stage_arrow
from .batch_input import stage_batch
from .csv_input import csv_reader, stage_csv
from .files import SIGNATURES, binary_lines, open_binary
from .json_input import json_file_reader, stage_json
from .parquet_input import parquet_reader, stage_parquet
from .staging import FastRead, Staged

#: ``reader(con, spec, files)``: the one-go read, or raises a DuckDB error about the data.
Reader = Callable[[Any, JobSpec, list[str]], FastRead]
#: ``stage(con, spec, files, scratch)``: the files read row by row into the view ``src``.
Stager = Callable[[Any, JobSpec, list[str], Path], Staged]


@dataclass(frozen=True)
class InputFormat:
    """One input format.

    ``name``: ``input_format``'s value. ``kind``: how messages name it. ``suffixes``: the file names
    ``input_format: auto`` tells it by (each also with ``.gz``). ``magic``: the first bytes of a
    binary format's files (None: a text format; a file that is binary then is refused, naming it).
    ``reader``: DuckDB's one-go read (None: the files are always staged row by row, each row checked).
    ``stage``: the row-by-row read. ``digest``: what the signature hashes of a local file, its
    ``footer`` (Parquet: one seek on a huge file) or every byte. ``in_signature``: the format's name
    is part of the input's signature (the same file read as requests is another input)."""

    name: str
    kind: str
    suffixes: tuple[str, ...]
    magic: bytes | None
    reader: Reader | None
    stage: Stager
    digest: Literal["footer", "bytes"] = "bytes"
    in_signature: bool = False


def _batch(name: str, kind: str) -> InputFormat:
    return InputFormat(name, kind, (), None, None, stage_batch, in_signature=True)


FORMATS: dict[str, InputFormat] = {f.name: f for f in (
    InputFormat("parquet", "Parquet", (".parquet",), b"PAR1", parquet_reader, stage_parquet, digest="footer"),
    InputFormat("csv", "CSV", (".csv", ".tsv"), None, csv_reader, stage_csv),
    InputFormat("json", "JSONL", (".jsonl", ".ndjson", ".json"), None, json_file_reader, stage_json),
    InputFormat("arrow", "Arrow IPC", (".arrow", ".feather", ".ipc"), b"ARROW1", None, stage_arrow),
    _batch("openai_batch", "OpenAI batch"),
    _batch("anthropic_batch", "Anthropic batch"),
)}
assert set(BATCH_INPUTS) == {f.name for f in FORMATS.values() if f.in_signature}


def format_of(spec: JobSpec) -> InputFormat:
    """The record of ``spec.input_format``; ``auto``: the one whose suffix ends the input's name."""
    if spec.input_format != "auto":
        return FORMATS[spec.input_format]
    name = spec.input.lower().split("?")[0]
    for fmt in FORMATS.values():
        if any(name.endswith(suffix) or name.endswith(suffix + ".gz") for suffix in fmt.suffixes):
            return fmt
    told = ", ".join(f.name for f in FORMATS.values() if f.suffixes)
    raise InputError(f"cannot tell the format of input={spec.input!r}: set input_format to one of {told}")


def diagnose(f: str, fmt: InputFormat) -> None:
    """Raise :class:`InputError` when ``f`` is plainly not a readable file of format ``fmt``."""
    with open_binary(f) as fh:
        try:
            head = fh.read(65536)
        except (OSError, EOFError) as exc:  # e.g. a truncated or fake .gz
            raise InputError(f"cannot read input file {f}: {exc}: check the file") from None
    if not head:
        raise InputError(f"input file {f} is empty (0 bytes): re-export it or remove it from input")
    if fmt.magic is not None:
        if not head.startswith(fmt.magic):
            raise InputError(f"input file {f} is not {_a(fmt.kind)} file ({_looks_like(head)}): set input_format "
                             f"to match the file, or give a {' or '.join(fmt.suffixes)} file")
        return
    for other in FORMATS.values():
        if other.magic is not None and head.startswith(other.magic):
            raise InputError(f"input file {f} is {_a(other.kind)} file, not {fmt.kind}: "
                             f"set input_format={other.name!r}")
    for magic, what, fix in SIGNATURES:
        if head.startswith(magic):
            raise InputError(f"input file {f} is {what}: {fix.format(name=Path(f).name)}")
    bad = binary_lines(head)
    if bad is not None:
        raise InputError(f"input file {f} is binary data, not {fmt.kind} text ({_looks_like(head)}; {bad[0]} of the "
                         f"{bad[1]} lines of its first 64 KiB hold NUL or other bytes no text has): check input and "
                         "input_format")


def _a(kind: str) -> str:
    return f"{'an' if kind[0] in 'AEIOU' else 'a'} {kind}"


def _looks_like(head: bytes) -> str:
    for fmt in FORMATS.values():
        if fmt.magic is not None and head.startswith(fmt.magic):
            return f"it is {fmt.kind}"
    if b"\x00" in head[:4096]:
        return f"it starts with bytes {head[:8].hex(' ')}"
    return "it starts with text " + repr(head[:40].decode("utf-8", "replace"))
