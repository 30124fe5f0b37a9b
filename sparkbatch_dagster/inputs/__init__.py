"""Reading and sharding inputs: from the user's files to one Parquet file per shard.

Modules:

- :mod:`.formats`: every input format as one record (:class:`InputFormat`): suffixes, signature, readers;
- :mod:`.shards`: :func:`build_shards`: DuckDB reads the input, hash shards, the manifest;
- :mod:`.sources`: the input's files, a DuckDB connection to read them, the input's signature;
- :mod:`.ids`: stable row ids and the shard query; a generated id never equals a real one;
- :mod:`.shard_files`: whether a home's shard files are whole; a damaged one is made again;
- :mod:`.files`: sniffing a file's format and CSV options;
- :mod:`.csv_input`, :mod:`.json_input`, :mod:`.parquet_input`: DuckDB's one-go read of each, and the slow
  path for hostile files, row by row;
- :mod:`.arrow_input`: Arrow IPC / Feather files, always read by pyarrow, row by row;
- :mod:`.staging`: what every reader shares: rows staged as files and exposed as the view ``src``;
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
from .formats import FORMATS, InputFormat, format_of
from .json_input import stage_json
from .parquet_input import stage_parquet
from .staging import STAGED_COLUMNS, Staged

__all__ = [
    "FORMATS",
    "InputFormat",
    "STAGED_COLUMNS",
    "Staged",
    "csv_options",
    "delimiter_hint",
    "empty_files",
    "format_of",
    "sniff",
    "stage_csv",
    "stage_json",
    "stage_parquet",
]
