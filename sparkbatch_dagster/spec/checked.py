"""Settings whose validation errors read as one :class:`~sparkbatch_dagster.errors.ConfigError`
naming each field, what is wrong and the fix; and the fingerprint that names versions.

Example::

    class MySettings(Checked):
        _owner: ClassVar[str] = "mine"
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError


class Checked(BaseModel):
    """Settings whose validation errors become a :class:`ConfigError` naming field and fix."""

    _owner: ClassVar[str] = "settings"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(explain(exc, self._owner)) from None


def fingerprint(payload: Any) -> str:
    """A short stable hash of JSON-serializable data."""
    raw = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def explain(exc: ValidationError, owner: str) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "spec"
        msg = str(err["msg"]).removeprefix("Value error, ")
        value = err.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"{owner}.{where}: {msg}{shown}")
    return f"invalid {owner} settings:\n  " + "\n  ".join(lines)
