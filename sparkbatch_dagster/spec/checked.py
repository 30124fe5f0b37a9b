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


#: storage_options keys that hold a secret (compared in lower case): only by reference (EnvVar /
#: {env: NAME}), for the home and the table sink alike.
SECRET_KEYS = {"key", "secret", "token", "password", "aws_secret_access_key", "aws_access_key_id",
               "aws_session_token", "session_token", "account_key", "sas_token", "client_secret",
               "azure_storage_account_key", "azure_storage_sas_key", "azure_client_secret",
               "google_service_account_key"}


def no_written_secret(options: dict[str, Any], field: str, readers: str) -> dict[str, Any]:
    """``options`` unchanged, or a ValueError naming the first secret written out in them and how
    to pass it by reference; ``readers``: who reads them from the environment instead."""
    secret = sorted(k for k, x in options.items() if k.lower() in SECRET_KEYS and isinstance(x, str)
                    and type(x).__name__ != "EnvVar")
    if secret:
        raise ValueError(f"{field}[{secret[0]!r}] is a secret written in the spec: pass it by reference, "
                         f"{secret[0]}: {{env: MY_VAR}} in YAML or EnvVar('MY_VAR') in Python (or leave it out: "
                         f"{readers})")
    return options
