"""Reading and sharding inputs: from the user's files to one Parquet file per shard.

Modules:

- :mod:`.shards`: :func:`build_shards`: DuckDB reads the input, hash shards, the manifest;
- :mod:`.ids`: stable row ids and the shard query; a generated id never equals a real one;
- :mod:`.shard_files`: whether a home's shard files are whole; a damaged one is made again;
- :mod:`.files`: sniffing a file's format and CSV options;
- :mod:`.csv_input`, :mod:`.json_input`, :mod:`.parquet_input`: the slow path for hostile files, line by line;
- :mod:`.staging`: those lines staged as files and exposed as the view ``src``;
- :mod:`.batch_input`: OpenAI / Anthropic batch files, every line a row or an error row.

The slow path, for files DuckDB could not read in one go:

- every physical data line (or quoted multi-line record) of a CSV/JSONL file becomes exactly one
  row: good rows keep their values, bad rows get ``_sb_error`` (``invalid_text: line N: ...`` or
  ``unparsable_row: line N: ...``), their id when it could be read, and NULL text;
- the rows are staged as files in a scratch folder and exposed as the view ``src`` with
  ``_sb_file`` / ``_sb_line``, so row order (and generated ids) follow the input lines;
- a file that cannot be read at all (empty, binary, another format, another encoding, no
  readable row) raises :class:`InputError` with one line naming the file and the fix.

May import: ``errors``, ``spec``, ``home``.
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
