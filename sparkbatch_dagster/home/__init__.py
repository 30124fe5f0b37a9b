"""The job's home on disk: where every file of a job lives, how it is written, who may write it.

Owns the folder layout (:class:`JobHome`, shard keys), commit points (:mod:`.atomic`: write to a
temporary name, fsync, rename), the locks between processes (:mod:`.locks`) and content digests
of files and objects (:mod:`.digests`), which the model identity and the input signature use.

May import: ``errors``. Every room above uses it; it knows nothing of specs, engines or Dagster.
"""

from .atomic import atomic_write_parquet, atomic_write_text, failpoint
from .layout import JobHome, check_key, shard_key
from .locks import FileLock

__all__ = ["FileLock", "JobHome", "atomic_write_parquet", "atomic_write_text", "check_key", "failpoint", "shard_key"]
