"""The base of the estimate's typed records (``records.py``, ``review_records.py``): a frozen
msgspec Struct whose dict form is its fields, in order.

Example::

    class Thing(Record, frozen=True, kw_only=True):
        name: str

    Thing(name="a").to_json()   # {"name": "a"}
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

SpeedBasis = Literal["measured", "projected", "unknown"]


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """A frozen record whose dict form is its fields, in order (nested records as dicts). Each
    subclass repeats ``frozen=True, kw_only=True``: mypy reads the options per class."""

    def to_json(self) -> dict[str, Any]:
        """The record as the report file and the CLI's JSON have it."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out
