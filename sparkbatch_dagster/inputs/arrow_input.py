"""Arrow IPC files (Feather v2, ``.arrow`` / ``.feather``): :func:`stage_arrow`. DuckDB reads them
only through an extension it would download, so they are always read by pyarrow, batch by batch,
each string value checked as a Parquet file's are (``parquet_input.stage_columnar``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from .parquet_input import stage_columnar
from .staging import Staged


def _open_arrow(fh: IO[bytes]) -> tuple[Any, Callable[[list[str]], Iterator[Any]]]:
    import pyarrow as pa

    reader = pa.ipc.open_file(pa.PythonFile(fh, mode="r"))

    def batches(present: list[str]) -> Iterator[Any]:
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i).select(present)

    return reader.schema, batches


def stage_arrow(con: Any, spec: Any, files: list[str], scratch: Path) -> Staged:
    """The wanted columns of Arrow IPC files as the view ``src``; a string value that is not UTF-8
    becomes NULL and its row an ``invalid_text: row N`` error row."""
    return stage_columnar(con, spec, files, scratch, "Arrow IPC", _open_arrow)
