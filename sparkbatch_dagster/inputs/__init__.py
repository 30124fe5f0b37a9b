"""Reading and sharding inputs: from the user's files to one Parquet file per shard.

Owns :func:`.shards.build_shards` (DuckDB reads the input, gives every row a stable id, splits
the rows into shards by a hash of the id, writes the manifest; the ids and the shard query are
:mod:`.ids`: a generated id never equals a real one; a damaged shard file, :mod:`.shard_files`, is
made again) and the slow path for hostile
files that DuckDB could not read in one go: a CSV, JSONL or Parquet input re-read line by line,
every line becoming exactly one row, good or carrying its reason (:mod:`.csv_input`,
:mod:`.json_input`, :mod:`.parquet_input`, staged by :mod:`.staging`; :mod:`.files` sniffs).

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
