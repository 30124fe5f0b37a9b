"""Hostile input: the slow path that turns a CSV, JSONL or Parquet input DuckDB could not read
in one go into rows, one per line, each either good or carrying its reason.

``shards.build_shards`` reads the input with DuckDB first; a clean file never comes here. Only
when that read fails (bytes that are not UTF-8, a broken JSON line, a ragged row, a stray quote,
a Parquet string that is not UTF-8) is every file re-read here, line by line:

- every physical data line (or quoted multi-line record) of a CSV/JSONL file becomes exactly one
  row: good rows keep their values, bad rows get ``_sb_error`` (``invalid_text: line N: ...`` or
  ``unparsable_row: line N: ...``), their id when it could be read, and NULL text;
- the rows are staged as files in a scratch folder and exposed as the view ``src`` with
  ``_sb_file`` / ``_sb_line``, so row order (and generated ids) follow the input lines;
- a file that cannot be read at all (empty, binary, another format, another encoding, no
  readable row) raises :class:`InputError` with one line naming the file and the fix.
"""

from .csv_input import stage_csv
from .files import csv_options, delimiter_hint, empty_files, sniff
from .json_input import stage_json
from .parquet_input import stage_parquet
from .staging import STAGED_COLUMNS, Staged

__all__ = [
    "STAGED_COLUMNS",
    "Staged",
    "csv_options",
    "delimiter_hint",
    "empty_files",
    "sniff",
    "stage_csv",
    "stage_json",
    "stage_parquet",
]
