"""Row ids and the shard query: every row of the view ``src`` gets a stable, unique id, its input
error (or none), its text values and its shard.

An id is the id column's value as text: a string as it is, a number as its text (a JSONL id is
read as text, see :func:`.json_input.json_reader`). Rows that have no usable id get a generated
one, made from the input alone, so sharding the same input again (with any shard count) gives
every row the same id, and a rerun resumes instead of relabeling:

- the 2nd, 3rd ... row with an id already used: ``<id>#dup2``, ``<id>#dup3`` ... (error row
  ``duplicate_id``), the first keeps the id;
- a row whose id is null: ``null-id-<n>``, ``n`` its position in the input (error row ``null_id``);
- a line that could not be read, its id unknown: ``unparsable-line-<n>`` (``unparsable-<f>-line-<n>``
  over several files, ``f`` the file's position in the glob);
- no id column: ``row-<n>``, ten digits.

A generated id never equals a real one: if the input also holds that id (a real row ``a#dup2``
beside two rows ``a``), the generated one takes ``~`` signs until it is unused: ``a#dup2~``. Every
generated name ends in a digit before its ``~`` signs, so two generated ids never meet either.

Example: ids ``a, a, a#dup2, <null>, null-id-4`` become ``a, a#dup2~, a#dup2, null-id-4~, null-id-4``.
"""

from __future__ import annotations

from ..spec import JobSpec

_NESTED = ("STRUCT", "MAP", "UNION")


def quote_ident(name: str) -> str:
    """A column name as a DuckDB identifier (quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _text_expr(col: str, dtype: str) -> tuple[str, str]:
    """(value expression, error expression) for one text column of DuckDB type ``dtype``."""
    q = quote_ident(col)
    lit = col.replace("'", "''")
    if dtype in ("VARCHAR", "BLOB"):
        return q, "NULL"
    if dtype == "JSON":
        return (f"CASE WHEN json_type({q}) = 'VARCHAR' THEN {q} ->> '$' END",
                f"CASE WHEN {q} IS NOT NULL AND json_type({q}) <> 'VARCHAR' THEN "
                f"'bad_type: column ''{lit}'' holds ' || json_type({q}) || ', expected text' END")
    if dtype.startswith(_NESTED) or dtype.endswith("]"):
        return "NULL", f"'bad_type: column ''{lit}'' has type {dtype}, expected text'"
    return f"CAST({q} AS VARCHAR)", "NULL"


def _generated(spec: JobSpec, staged: bool, several_files: bool) -> str:
    """The generated name of a row that needs one (NULL for a row keeping its id)."""
    if not spec.id_column:
        return "'row-' || lpad(CAST(_ord AS VARCHAR), 10, '0')"
    unread = ""
    if staged:  # a line that could not be read and whose id is unknown: named after its line
        line_id = ("'unparsable-' || (_sb_file + 1) || '-line-' || _sb_line" if several_files
                   else "'unparsable-line-' || _sb_line")
        unread = f"WHEN _sb_error IS NOT NULL AND _raw_id IS NULL THEN {line_id}"
    return f"""CASE {unread} WHEN _raw_id IS NULL THEN 'null-id-' || _ord
                    WHEN _dup > 1 THEN _raw_id || '#dup' || _dup END"""


def shard_sql(spec: JobSpec, types: dict[str, str], order: str, k: int, staged: bool, several_files: bool) -> str:
    """The query giving every row of ``src`` (read in ``order``) its id, input error, text
    values and shard (of ``k``); ``staged``: ``src`` is the line-by-line read, with ``_sb_*``."""
    selects, errors = [], []
    for col in spec.text_columns:
        value, err = _text_expr(col, types[col])
        selects.append(f"{value} AS {quote_ident(col)}")
        errors.append(err)
    if spec.gold_column and spec.gold_column not in spec.text_columns:
        selects.append(f"CAST({quote_ident(spec.gold_column)} AS VARCHAR) AS {quote_ident(spec.gold_column)}")
    raw_id = f"CAST({quote_ident(spec.id_column)} AS VARCHAR)" if spec.id_column else "NULL::VARCHAR"
    input_error = f"coalesce({', '.join(errors)})" if any(e != "NULL" for e in errors) else "NULL::VARCHAR"
    unread_error = "WHEN _sb_error IS NOT NULL THEN _sb_error" if staged else ""
    # Only the columns the query reads: the named rows are kept in memory (or spilled), and an
    # unused wide column must not be read, let alone kept.
    used = dict.fromkeys([*spec.text_columns, *([spec.gold_column] if spec.gold_column else []),
                          *(("_sb_file", "_sb_line", "_sb_error") if staged else ())])
    # A generated name that a real id already holds takes '~' signs past the longest such real
    # id ('a#dup2' taken, 'a#dup2~' too: 'a#dup2~~'). Real ids are matched with their '~' signs
    # trimmed: one hash join of the few generated names against the input's ids.
    tildes = ("SELECT NULL::BIGINT AS _ord, 0 AS _tildes WHERE false" if not spec.id_column else """
            SELECT g._ord, CASE WHEN bool_or(r._raw_id = g._gen)
                                THEN max(length(r._raw_id) - length(g._gen)) + 1 ELSE 0 END AS _tildes
            FROM named g JOIN named r ON rtrim(r._raw_id, '~') = g._gen
            WHERE g._gen IS NOT NULL GROUP BY g._ord""")
    return f"""
        WITH base AS (
            SELECT {", ".join(quote_ident(c) for c in used)}, row_number() OVER (ORDER BY {order}) AS _ord,
                   {raw_id} AS _raw_id FROM src
        ), ided AS (
            SELECT *, row_number() OVER (PARTITION BY _raw_id ORDER BY _ord) AS _dup FROM base
        ), named AS MATERIALIZED (
            SELECT *, {_generated(spec, staged, several_files)} AS _gen FROM ided
        ), taken AS ({tildes}
        ), final AS (
            SELECT
                CASE WHEN _gen IS NULL THEN _raw_id
                     ELSE _gen || repeat('~', coalesce(_tildes, 0)::BIGINT) END AS row_id,
                CASE {unread_error}
                     WHEN {'_raw_id IS NULL' if spec.id_column else 'false'} THEN 'null_id: id column is null'
                     WHEN _dup > 1 THEN 'duplicate_id: id ' || _raw_id || ' already used by an earlier row'
                     ELSE {input_error} END AS _input_error,
                {", ".join(selects)}, _ord
            FROM named LEFT JOIN taken USING (_ord)
        )
        SELECT * EXCLUDE (_ord), CAST(('0x' || substr(md5(row_id), 1, 15)) AS BIGINT) % {k} AS _shard
        FROM final ORDER BY _ord
    """
