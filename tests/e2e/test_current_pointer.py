"""``current.json`` and the shard manifest move only forward (home/pointer.py, Mirror.publish_shards),
tried as issue 49 found the pointer broken: box A's PUT is held by the store while the input
changes and box B labels the new input; when A's PUT lands, readers must still see B's version.
The store is slow for exactly as long as the test needs: the fault proxy holds A's request until
released (no clock)."""

from __future__ import annotations

import json

import pytest

from e2e.test_bucket_home import SHARDS, BucketJob, _kill, _wait_for
from testkit import unique_rows, write_parquet


@pytest.mark.parametrize("held", ["current.json", pytest.param("shards/manifest.json", marks=pytest.mark.long)])
def test_a_slow_put_of_an_old_input_never_moves_readers_back(tmp_path, s3_server, fault_proxy, held):
    """``held``: A's pointer PUT at its first commit, or its manifest PUT when it shards."""
    job = BucketJob(tmp_path, s3_server, endpoint=fault_proxy.url)
    fault_proxy.hold(("PUT",), held)
    first = job.start("box-a", "t1")  # through the proxy: its PUT of ``held`` waits there
    try:
        _wait_for(lambda: fault_proxy.counts["held"] >= 1, first)
        rows = unique_rows(200)
        for r in rows:
            r["text"] += " (v2)"
        write_parquet(job.input, rows)  # the input changes while A's PUT is on the wire
        second, _ = job.finish("box-b", "t2", AWS_ENDPOINT_URL=s3_server.endpoint_url)  # straight to the store
        assert second["partitions_done"] == SHARDS and job.fs.cat_file(f"{job.url}/current.json")
        fault_proxy.release()  # A's PUT lands now, long after B's
        out, err = first.communicate(timeout=300)
        assert first.returncode == 0, err[-3000:]
    finally:
        _kill(first)
    fault_proxy.stop()
    fault_proxy.wait_closed()  # every request A sent has landed (or not) before we look
    pointer = json.loads(job.fs.cat_file(f"{job.url}/current.json"))
    assert pointer["version"] == second["version"] and pointer["signature"]
    # A third box's status sees every shard of the new input done.
    status, _ = job.finish("box-c", "t3", "status", AWS_ENDPOINT_URL=s3_server.endpoint_url)
    assert status["partitions_done"] == SHARDS and status["missing"] == [], status
