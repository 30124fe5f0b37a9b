"""``sparkbatch sql``'s database: a read path, so it writes nothing in the home
(``docs/protocol.md``, "Reads").

:func:`read_only` opens an in-memory DuckDB whose tables ``run_metrics`` and ``attempts`` are
filled from the stats and attempt files (what ``metrics.duckdb`` is derived from: a damaged one
does not matter here, and it is not opened) and whose views are :func:`.views.define_views`'; then
locks it before the user's query runs: it may read the files its views read and no other
(``enable_external_access`` off, ``allowed_paths`` those files), install or load no extension,
change no setting (``lock_configuration``). :func:`query` runs one SELECT (``FROM``, ``WITH``,
``DESCRIBE``, ``SUMMARIZE``, ``SHOW`` are SELECTs too) and refuses any other statement before it
runs: ``COPY ... TO`` a file the views read (``USE_TMP_FILE false``) or ``EXPLAIN ANALYZE COPY``
would write it, whatever the settings say. The caller refreshes a bucket home first
(``JobHome.refresh``: the commits, and the calibrations, threshold and reviewers' labels every box
published), so every box reads the same; a damaged one of those is left out, said in one line.

Example::

    with read_only(spec, home, version) as con:
        columns, rows = query(con, "FROM label_distribution")
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import SparkbatchError
from ..home import JobHome
from ..spec import JobSpec
from . import attempts
from .metrics import METRIC_COLUMNS, committed_stats
from .views import define_views, fill, sql_path

log = logging.getLogger("sparkbatch")
#: What ``sparkbatch sql`` offers: the views, then the tables.
NAMES = ("labeled", "label_distribution", "review", "reliability", "run_metrics", "attempts")


@contextmanager
def read_only(spec: JobSpec, home: JobHome, version: str) -> Iterator[Any]:
    """An in-memory DuckDB with ``version``'s tables and views, locked (see the module's doc)."""
    import duckdb

    stats = committed_stats(home, version)  # only shards whose files are what their commits recorded
    for key in (home.read_manifest() or {"keys": []})["keys"]:
        why = None if key in stats else home.broken(version, key)
        if why is not None:
            log.warning("%s of version %s is left out (%s): `sparkbatch run` recomputes it", key, version, why)
    attempts.record_killed(home, version)  # the one write a reader makes: a dead attempt's end (protocol.md)
    con = duckdb.connect(":memory:")
    try:
        fill(con, "run_metrics", METRIC_COLUMNS, ("partition", "version"), [s.to_json() for s in stats.values()])
        fill(con, "attempts", attempts.COLUMNS, ("attempt",), [r.to_json() for r in attempts.load(home, version)])
        paths = define_views(con, spec, home, version, sorted(stats)) if stats else []
        con.execute(f"SET allowed_paths = [{', '.join(sql_path(p) for p in paths)}]")
        for setting in ("enable_external_access", "autoinstall_known_extensions", "autoload_known_extensions"):
            con.execute(f"SET {setting} = false")
        con.execute("SET lock_configuration = true")
        yield con
    finally:
        con.close()


def query(con: Any, sql: str) -> tuple[list[str], list[list[Any]]]:
    """Run one SELECT on a :func:`read_only` connection; (columns, rows). Anything else, a file it may
    not read, or a query DuckDB refuses: one line, as a :class:`SparkbatchError`."""
    import duckdb

    offers = f"`sparkbatch sql` runs one SELECT over {', '.join(NAMES)}"
    try:
        statements = con.extract_statements(sql)
        if len(statements) != 1:
            raise SparkbatchError(f"query refused: {len(statements)} statements: {offers}")
        if statements[0].type != duckdb.StatementType.SELECT:
            word = (statements[0].query.split() or ["?"])[0].upper()
            raise SparkbatchError(f"query refused: {word} is not a SELECT: {offers}; the job's home is only read")
        cur = con.execute(sql)
        return [d[0] for d in cur.description or []], [list(r) for r in cur.fetchall()]
    except duckdb.PermissionException as exc:  # a file outside the views', an extension
        raise SparkbatchError(f"query refused: {str(exc).splitlines()[0]}: {offers}, no other file") from None
    except duckdb.Error as exc:  # a typo in the query: DuckDB's own message says where
        raise SparkbatchError(f"query failed: {str(exc).splitlines()[0]}") from None
