"""The table sink: the current output version's committed shards as a Delta Lake table.

Synced from the commits, not written by them. A shard's commit (``checkpoint.py``, with a bucket
home ``home/mirror.py``) stays the one decision that a shard is done; :func:`sync_table` then
compares the table's ``(version, shard)`` set with the committed set and writes what differs, in
ONE Delta commit: the missing shards' rows in, every other version's rows out. Run it again and
it finds nothing to do and writes nothing (no new table version), so a retried or replayed sync,
a crash between a shard's commit and the sync, and a run resumed on another box all end with
each committed row in the table once.

Writers at the same time (two boxes syncing one bucket home) are safe without a lock: the write
is a replace-where (``mode="overwrite"`` with a predicate over exactly the shards it brings), based
on the snapshot it read, and delta-rs refuses to commit it when another writer added rows it
would have replaced (``CommitFailedError``: "a concurrent transaction added new data"). The loser
reads the table again and finds those shards there. On S3, delta-rs 1.x commits with S3's
conditional writes (``If-None-Match``), so no DynamoDB lock is needed.

Example::

    summary = sync_table(spec, home, version)     # {"uri": ..., "rows": ..., "shards_added": [...], ...}
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ..errors import ConfigError, SparkbatchError
from ..home import JobHome
from ..home.bucket import resolve_options
from ..spec import JobSpec
from .checkpoint import OUTPUT_SCHEMA

log = logging.getLogger("sparkbatch")

#: Every row of the table: its output version and shard, then the output row's own columns.
TABLE_SCHEMA = pa.schema([("version", pa.string()), ("shard", pa.string()), *OUTPUT_SCHEMA])

#: Reads and writes per sync before giving up: each lost race means another writer synced meanwhile.
TRIES = 8


def check_sink(spec: JobSpec) -> None:
    """Stop before any engine starts when the job has a sink this machine cannot write: no
    deltalake package, or a ``storage_options`` variable that is not set."""
    if spec.sink is None:
        return
    try:
        import deltalake  # noqa: F401 - here, not at module level: the UI loads without it
    except ImportError:
        raise ConfigError("the job has a sink (format: delta) but the deltalake package is not installed: "
                          "pip install 'sparkbatch-dagster[delta]' (or remove sink from the job)") from None
    _options(spec)


def table_uri(spec: JobSpec) -> str:
    """Where the job's table lives (``sink.uri``, or under the home: a folder or bucket alike)."""
    if spec.sink is None:
        raise ConfigError(f"job {spec.name!r} has no sink: set sink: {{format: delta}} to keep a table")
    return spec.sink.location(spec.home_url or str(spec.home_path))


def _options(spec: JobSpec) -> dict[str, str]:
    assert spec.sink is not None
    return {k: str(v) for k, v in resolve_options(spec.sink.storage_options).items()}


def open_table(spec: JobSpec) -> Any:
    """The table as delta-rs reads it (a ``deltalake.DeltaTable``), or None before its first sync."""
    check_sink(spec)
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(table_uri(spec), storage_options=_options(spec))
    except TableNotFoundError:
        return None


def _present(table: Any) -> set[tuple[str, str]]:
    """The ``(version, shard)`` pairs the table holds (two columns read, the rest not)."""
    if table is None:
        return set()
    got = table.to_pyarrow_table(columns=["version", "shard"]).group_by(["version", "shard"]).aggregate([])
    return set(zip(got.column("version").to_pylist(), got.column("shard").to_pylist(), strict=True))


def _rows(home: JobHome, version: str, keys: list[str]) -> Iterator[pa.RecordBatch]:
    """The committed files of ``keys`` as table rows, one shard at a time (never all in memory)."""
    import pyarrow.parquet as pq

    for key in keys:
        # With the schema: files written before a column existed read with it null.
        table = pq.read_table(home.labeled_path(version, key), schema=OUTPUT_SCHEMA)
        n = table.num_rows
        table = table.add_column(0, "shard", pa.array([key] * n, pa.string()))
        table = table.add_column(0, "version", pa.array([version] * n, pa.string()))
        yield from table.cast(TABLE_SCHEMA).to_batches()


def _quoted(keys: list[str]) -> str:
    # Keys passed check_key (shard-NNNNN) and versions are hex: nothing in them needs escaping.
    return ", ".join(f"'{k}'" for k in keys)


def sync_table(spec: JobSpec, home: JobHome, version: str) -> dict[str, Any]:
    """Make the table hold exactly the committed shards of ``version``, each row once.

    Writes nothing when it already does (a replay is a no-op: same table version). Else one Delta
    commit adds the missing shards and drops every other version's rows; a concurrent writer that
    won the race makes this one read again (see the module's docstring).
    """
    check_sink(spec)
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError

    uri, options = table_uri(spec), _options(spec)
    keys = (home.read_manifest() or {"keys": []})["keys"]
    committed = [k for k in keys if home.is_done(version, k)]
    for _ in range(TRIES):
        table = open_table(spec)
        _check_owner(spec, uri, table)
        present = _present(table)
        missing = [k for k in committed if (version, k) not in present]
        stale = sorted({v for v, _ in present if v != version})
        if not missing and not stale:
            return _summary(uri, table, [], [])
        try:
            if missing:
                predicate = f"version <> '{version}' OR shard IN ({_quoted(missing)})"
                reader = pa.RecordBatchReader.from_batches(TABLE_SCHEMA, _rows(home, version, missing))
                # A DeltaTable, not the URI: the write is checked against the snapshot read above.
                write_deltalake(table if table is not None else uri, reader, mode="overwrite", predicate=predicate,
                                storage_options=options, schema_mode="merge", name=spec.name,
                                description=f"sparkbatch job {spec.name}: labeled rows of the current output version")
            else:
                table.delete(f"version <> '{version}'")
        except CommitFailedError as exc:
            log.info("the table %s changed while it was synced (%s): read again", uri, str(exc).splitlines()[0])
            continue
        if stale:
            log.info("table %s: rows of version(s) %s replaced by version %s", uri, stale, version)
        return _summary(uri, open_table(spec), missing, stale)
    raise SparkbatchError(f"the table {uri} kept changing under {TRIES} syncs in a row: another writer is "
                          "writing it all the time; run analytics again when it is quiet")


def _check_owner(spec: JobSpec, uri: str, table: Any) -> None:
    """Refuse a table this job did not create: a sync replaces every other version's rows, so two
    jobs on one table would delete each other's (the table's name, set at creation, is the job's)."""
    if table is None:
        return
    owner = table.metadata().name
    if owner != spec.name:
        whose = f"job {owner!r}'s" if owner else "not a table a sparkbatch job created: it is someone else's"
        raise ConfigError(f"sink.uri {uri} is {whose} table, and a sync would replace its rows: give job "
                          f"{spec.name!r} a sink.uri of its own")


def _summary(uri: str, table: Any, added: list[str], replaced: list[str]) -> dict[str, Any]:
    """What the sync did and what the table holds now (numbers from its log, no data read)."""
    if table is None:
        return {"uri": uri, "table_version": None, "rows": 0, "shards_added": added, "versions_replaced": replaced}
    actions = table.get_add_actions(flatten=True)
    rows = sum(n or 0 for n in actions.column("num_records").to_pylist()) if len(actions) else 0
    return {"uri": uri, "table_version": table.version(), "rows": rows, "files": len(actions),
            "shards_added": added, "versions_replaced": replaced}
