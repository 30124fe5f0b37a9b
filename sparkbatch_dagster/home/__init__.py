"""The job's home on disk: where every file of a job lives, how it is written, who may write it.

Modules:

- :mod:`.layout`: the folder layout (:class:`JobHome`) and the paths built from shard keys;
- :mod:`.pointer`: ``current.json``, the output version readers see, moved only forward;
- :mod:`.atomic`: commit points (temporary name, fsync, rename) and failpoints;
- :mod:`.commit_record`: what a committed labeled file must be (rows, sha256, length);
- :mod:`.locks`: locks between processes;
- :mod:`.digests`: content digests of files and objects (the model identity and the input signature use them);
- :mod:`.bucket`: a home in an object store: retried calls and conditional writes;
- :mod:`.mirror`: the local cache kept in step with the bucket, written by :mod:`.uploader`'s thread;
- :mod:`.uploader`: the upload thread of a bucket home;
- :mod:`.review_files`: the review's files (calibrations, threshold, reviewers' labels) pulled from a bucket,
  and damaged ones set aside;
- :mod:`.lease`: box leases and shard claims between boxes, renewed by :mod:`.keeper`;
- :mod:`.keeper`: the thread that renews a box's lease;
- :mod:`.partition_lock`: a run's lock on one shard;
- :mod:`.opening`: opening a home from a spec: a folder, or a bucket with its cache;
- :mod:`.compile_store`: the engine's compile cache kept in the home for the next machine.

The whole bucket protocol on one page: docs/protocol.md.

May import: ``errors``. Every room above uses it; it knows nothing of specs, engines or Dagster.
"""

from .atomic import atomic_write_parquet, atomic_write_text, failpoint
from .bucket import Bucket, is_url
from .layout import JobHome, check_key, shard_key
from .locks import FileLock
from .opening import open_home

__all__ = ["Bucket", "FileLock", "JobHome", "atomic_write_parquet", "atomic_write_text", "check_key", "failpoint",
           "is_url", "open_home", "shard_key"]
