"""The table sink's settings: the job's labeled rows as a Delta Lake table too.

``JobSpec.sink`` is optional; with it, the ``analytics`` asset keeps a Delta Lake table in step
with the committed shards of the current output version (``run/table_sink.py``, and
docs/table-sink.md for why Delta Lake, and why synced from the commits). Example (YAML)::

    sink:
      format: delta
      uri: s3://warehouse/labels/tickets     # None: <home>/tables/labeled; a relative path: under the home
      storage_options:                        # delta-rs (object_store) options, not fsspec's
        AWS_REGION: eu-west-1
        AWS_SECRET_ACCESS_KEY: {env: WAREHOUSE_SECRET}
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .checked import no_written_secret

#: URL schemes delta-rs writes to (its object_store backends); anything else is a local path.
DELTA_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "file", "memory")

class SinkSpec(BaseModel):
    """Where the labeled rows go as a table (``JobSpec.sink``).

    Example::

        JobSpec(..., sink=SinkSpec(format="delta", uri="s3://warehouse/labels/tickets"))

    The table holds the committed rows of the current output version, each once, with its
    ``version`` and ``shard`` columns; a new version replaces the old one's rows (the older table
    stays readable by Delta time travel).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["delta"] = Field(
        default="delta", description="Table format: 'delta' (Delta Lake, written with the deltalake package).")
    uri: str | None = Field(
        default=None, description="Table location: a folder or URL (s3://, gs://, az://, abfss://); a relative "
        "path is under the job's home (a bucket home too); None = <home>/tables/labeled.")
    storage_options: dict[str, Any] = Field(
        default_factory=dict, repr=False, description="delta-rs storage options (AWS_REGION, AWS_ENDPOINT_URL, "
        "AWS_ALLOW_HTTP, ...). Secrets by reference only: a Dagster EnvVar or {env: NAME}; or leave them out: "
        "delta-rs reads the AWS_* / GOOGLE_* / AZURE_* variables itself.")

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("sink.uri is empty: give a folder or URL for the table, or leave it out for "
                             "<home>/tables/labeled")
        if "://" in value and value.split("://", 1)[0].lower() not in DELTA_SCHEMES:
            scheme = value.split("://", 1)[0]
            raise ValueError(f"sink.uri {value!r}: delta-rs cannot write to {scheme}://; use one of "
                             f"{', '.join(s + '://' for s in DELTA_SCHEMES)} or a local folder")
        return value

    @field_validator("storage_options")
    @classmethod
    def _check_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        return no_written_secret(value, "sink.storage_options",
                                 "delta-rs reads AWS_* / GOOGLE_* / AZURE_* variables itself")

    def location(self, home: str) -> str:
        """The table's URI for a job whose home is ``home`` (a folder or URL)."""
        uri = self.uri or "tables/labeled"
        if "://" in uri or uri.startswith(("/", "~")):
            return os.path.expanduser(uri)
        return f"{home.rstrip('/')}/{uri}"
