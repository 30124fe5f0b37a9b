"""Opening a job's home from where a spec says it lives: a folder, or a bucket with its cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .bucket import Bucket, is_url
from .layout import JobHome
from .mirror import Mirror


def open_home(location: Path | str, cache: Path, storage_options: dict[str, Any] | None = None,
              lease_seconds: float = 60.0, results: Path | None = None, results_url: str | None = None) -> JobHome:
    """A job's home: a folder, or an object-store URL cached in ``cache``. Nothing is contacted
    here (the Dagster UI loads definitions offline); :meth:`JobHome.refresh` checks the store.

    Example::

        home = open_home("s3://my-bucket/jobs/tickets", Path(".sparkbatch/cache/tickets"))
        home.refresh(write=True)          # one line naming the URL and the fix if the store says no
    """
    results_remote = Bucket(results_url, storage_options) if results_url else None
    if not is_url(location):
        return JobHome(Path(str(location).removeprefix("file://")), results=results, results_remote=results_remote)
    mirror = Mirror(Bucket(str(location), storage_options), cache, lease_seconds)
    return JobHome(cache, mirror, results=results, results_remote=results_remote)
