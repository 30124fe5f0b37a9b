"""The job's home on disk: where every file of a job lives, how it is written, who may write it.

Owns the folder layout (:class:`JobHome`, shard keys), commit points (:mod:`.atomic`: write to a
temporary name, fsync, rename; what a committed file must be, :mod:`.commit_record`), the locks
between processes (:mod:`.locks`) and content digests of files and objects (:mod:`.digests`),
which the model identity and the input signature use;
and a home in an object store (:mod:`.bucket`, :mod:`.mirror`, :mod:`.uploader`, :mod:`.lease`,
:mod:`.keeper`, :mod:`.partition_lock`): the bucket the truth, the folder its cache, commits and
leases written with the store's conditions (the protocol on one page: docs/protocol.md); and
where a home keeps the engine's compile cache for the next machine (:mod:`.compile_store`).

May import: ``errors``. Every room above uses it; it knows nothing of specs, engines or Dagster.
"""

from .atomic import atomic_write_parquet, atomic_write_text, failpoint
from .bucket import Bucket, is_url
from .layout import JobHome, check_key, shard_key
from .locks import FileLock
from .opening import open_home

__all__ = ["Bucket", "FileLock", "JobHome", "atomic_write_parquet", "atomic_write_text", "check_key", "failpoint",
           "is_url", "open_home", "shard_key"]
