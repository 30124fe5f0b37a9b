"""The tests' S3 endpoint (moto's server in a subprocess, SigV4 enforced) and the fault proxy in
front of it: what the bucket-home tests rely on, checked through s3fs as the product uses it.

What these tests pin down about s3fs 2026.9 / botocore's default (legacy) retries:
- a 500 (InternalError) or 503 (SlowDown) is retried by botocore (5 attempts in all); s3fs retries
  SlowDown again itself (5 x 5 attempts), not InternalError. Exhausted, both surface as OSError.
- a connection closed without an answer is retried by aiohttp once (a reused keep-alive
  connection, idempotent method), by botocore and by s3fs: exhausted, botocore's
  ConnectionClosedError surfaces (no OSError translation).
- a PUT that landed upstream but whose answer was lost is simply sent again: a plain put ends
  well (written twice), a conditional create (``mode="create"``, IfNoneMatch) then fails with
  FileExistsError although the object is the caller's own write.
"""

from __future__ import annotations

import subprocess
import sys

import botocore.config
import botocore.exceptions
import psutil
import pytest

from faults import FaultProxy
from s3_server import S3Server
from testkit import SUPPORT


def puts(proxy: FaultProxy) -> list[tuple[str, str, str]]:
    return [entry for entry in proxy.log if entry[0] == "PUT"]


def test_s3fs_puts_gets_and_lists(s3_server: S3Server, s3_bucket: str) -> None:
    fs = s3_server.fs()
    fs.pipe_file(f"{s3_bucket}/job/a.txt", b"alpha")
    fs.pipe_file(f"{s3_bucket}/job/sub/b.txt", b"beta")
    assert fs.cat_file(f"{s3_bucket}/job/a.txt") == b"alpha"
    assert fs.info(f"{s3_bucket}/job/sub/b.txt")["size"] == 4
    assert sorted(fs.find(f"{s3_bucket}/job")) == [f"{s3_bucket}/job/a.txt", f"{s3_bucket}/job/sub/b.txt"]
    # The same objects seen by another client: they are in the server, not in a cache.
    listed = s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]
    assert sorted(o["Key"] for o in listed) == ["job/a.txt", "job/sub/b.txt"]
    fs.rm(f"{s3_bucket}/job/a.txt")
    assert not s3_server.fs().exists(f"{s3_bucket}/job/a.txt")


def test_standard_env_variables_reach_s3fs(s3_bucket: str, s3_server: S3Server) -> None:
    """s3_bucket sets AWS_ENDPOINT_URL and the keys: s3fs with no options at all finds the server."""
    import s3fs

    s3_server.fs().pipe_file(f"{s3_bucket}/x", b"via options")
    assert s3fs.S3FileSystem(skip_instance_cache=True).cat_file(f"{s3_bucket}/x") == b"via options"


@pytest.mark.parametrize(("override", "words"), [
    ({"key": "AKIAWRONGWRONGWRONG0"}, "does not exist in our records"),
    ({"secret": "not-the-secret"}, "signature"),
])
def test_bad_credentials_are_refused(s3_server: S3Server, s3_bucket: str, override: dict, words: str) -> None:
    with pytest.raises(PermissionError, match=words):
        s3_server.fs(**override).ls(s3_bucket)
    with pytest.raises(PermissionError):
        s3_server.fs(**override).pipe_file(f"{s3_bucket}/x", b"x")
    assert not s3_server.fs().exists(f"{s3_bucket}/x")


def test_missing_bucket_is_file_not_found(s3_server: S3Server) -> None:
    fs = s3_server.fs()
    with pytest.raises(FileNotFoundError):
        fs.ls("no-such-bucket-here")
    with pytest.raises(FileNotFoundError):
        fs.pipe_file("no-such-bucket-here/a", b"x")


def test_conditional_create_refuses_an_existing_key(s3_server: S3Server, s3_bucket: str,
                                                    fault_proxy: FaultProxy) -> None:
    for way, fs in (("direct", s3_server.fs()), ("proxied", s3_server.fs(endpoint_url=fault_proxy.url))):
        key = f"{s3_bucket}/manifest-{way}.json"
        fs.pipe_file(key, b"first", mode="create")
        with pytest.raises(FileExistsError):
            fs.pipe_file(key, b"second", mode="create")
        assert s3_server.fs().cat_file(key) == b"first"
    assert fault_proxy.counts["forwarded"] >= 2  # the second round really went through the proxy


def test_put_errors_are_retried_and_nothing_is_lost(s3_server: S3Server, s3_bucket: str,
                                                    fault_proxy: FaultProxy) -> None:
    """Half the PUTs answered 500/503 (at most 6; seed 37 spreads them over six puts, as botocore's
    backoff doubles on errors in a row): botocore retries each, every object lands once.
    Its default 5 attempts would lose a PUT to five errors in a row (1 in 32 at this rate),
    hence 10 retries here."""
    fs = s3_server.fs(endpoint_url=fault_proxy.url, config_kwargs={"retries": {"max_attempts": 10}})
    fault_proxy.set(error_rate=0.5, codes=(500, 503), methods={"PUT"}, max_faults=6, seed=37)
    written = {f"{s3_bucket}/part-{i:03d}": f"row {i}\n".encode() * (i + 1) for i in range(20)}
    for path, data in written.items():
        fs.pipe_file(path, data)
    counts = fault_proxy.counts
    assert counts["errors"] == 6
    assert counts["requests"] == counts["forwarded"] + counts["errors"]  # an error is never forwarded
    assert len([p for p in puts(fault_proxy) if p[2] == "forward"]) == 20  # each object landed once
    direct = s3_server.fs()
    assert {p: direct.cat_file(p) for p in written} == written


def test_s3_errors_are_xml_botocore_retries(s3_server: S3Server, s3_bucket: str, fault_proxy: FaultProxy) -> None:
    """The injected answers parse as S3's own: the right code, and botocore counts them retryable."""
    config = botocore.config.Config(retries={"max_attempts": 1, "mode": "legacy"})  # legacy: 1 retry
    client = s3_server.client(endpoint_url=fault_proxy.url, config=config)
    for status, code in ((500, "InternalError"), (503, "SlowDown")):
        fault_proxy.set(error_rate=1.0, codes=(status,), methods={"GET"})
        before = fault_proxy.counts["requests"]
        with pytest.raises(botocore.exceptions.ClientError) as caught:
            client.get_object(Bucket=s3_bucket, Key="anything")
        assert caught.value.response["Error"]["Code"] == code
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
        assert caught.value.response["ResponseMetadata"]["RetryAttempts"] == 1
        assert fault_proxy.counts["requests"] - before == 2
    assert fault_proxy.counts["forwarded"] == 0


def test_dropped_connections_are_retried(s3_server: S3Server, s3_bucket: str, fault_proxy: FaultProxy) -> None:
    fs = s3_server.fs(endpoint_url=fault_proxy.url)
    fs.ls(s3_bucket)  # a warm keep-alive connection, as in a job
    fault_proxy.set(drop_rate=0.3, methods={"PUT"}, max_faults=3, seed=3)
    written = {f"{s3_bucket}/d-{i}": f"value {i}".encode() for i in range(10)}
    for path, data in written.items():
        fs.pipe_file(path, data)
    assert fault_proxy.counts["drops"] == 3
    assert len([p for p in puts(fault_proxy) if p[2] == "forward"]) == 10  # a drop here is never forwarded
    assert {p: s3_server.fs().cat_file(p) for p in written} == written


def test_a_put_whose_answer_is_lost_is_sent_again(s3_server: S3Server, s3_bucket: str,
                                                  fault_proxy: FaultProxy) -> None:
    """The nasty case: the PUT landed, the client saw the connection close, and s3fs sent it again."""
    fs = s3_server.fs(endpoint_url=fault_proxy.url)
    fault_proxy.set(drop_after_upstream_rate=1.0, methods={"PUT"}, max_faults=1)
    fs.pipe_file(f"{s3_bucket}/part-0", b"payload")  # no error reaches the caller
    assert [fate for _, _, fate in puts(fault_proxy)] == ["drop_after_upstream", "forward"]  # written twice
    assert fault_proxy.counts["forwarded"] == 2
    assert s3_server.fs().cat_file(f"{s3_bucket}/part-0") == b"payload"


def test_a_conditional_create_whose_answer_is_lost_reports_exists(s3_server: S3Server, s3_bucket: str,
                                                                  fault_proxy: FaultProxy) -> None:
    """The retry of a create that landed meets its own object: FileExistsError for the caller's
    own write. A commit by conditional create must read the object back to tell which."""
    fs = s3_server.fs(endpoint_url=fault_proxy.url)
    fault_proxy.set(drop_after_upstream_rate=1.0, methods={"PUT"}, max_faults=1)
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{s3_bucket}/manifest.json", b"mine", mode="create")
    assert [fate for _, _, fate in puts(fault_proxy)] == ["drop_after_upstream", "forward"]
    assert s3_server.fs().cat_file(f"{s3_bucket}/manifest.json") == b"mine"


def test_multipart_upload_through_faults(s3_server: S3Server, s3_bucket: str, fault_proxy: FaultProxy) -> None:
    """A file bigger than one part goes up in parts (PUT ...?partNumber=&uploadId=), each retried."""
    fs = s3_server.fs(endpoint_url=fault_proxy.url)
    fault_proxy.set(error_rate=1.0, codes=(500,), methods={"PUT"}, path_contains="uploadId=", max_faults=2)
    data = bytes(range(256)) * (6 * 2**20 // 256)  # 6 MiB: two 5 MiB-block parts
    with fs.open(f"{s3_bucket}/big.bin", "wb", block_size=5 * 2**20) as f:
        f.write(data)
    assert fault_proxy.counts["errors"] == 2
    assert all("uploadId=" in path for _, path, fate in fault_proxy.log if fate == "error")
    assert s3_server.fs().cat_file(f"{s3_bucket}/big.bin") == data


def test_delays_are_counted_and_answers_intact(s3_server: S3Server, s3_bucket: str,
                                               fault_proxy: FaultProxy) -> None:
    s3_server.fs().pipe_file(f"{s3_bucket}/slow", b"eventually")
    fault_proxy.set(delay_rate=1.0, delay_s=0.05, methods={"GET", "HEAD"})
    fs = s3_server.fs(endpoint_url=fault_proxy.url)
    assert fs.cat_file(f"{s3_bucket}/slow") == b"eventually"
    assert fs.info(f"{s3_bucket}/slow")["size"] == len(b"eventually")
    counts = fault_proxy.counts
    assert counts["delays"] == counts["requests"] >= 2
    assert counts["forwarded"] == counts["requests"]
    fault_proxy.clear()
    fs.info(f"{s3_bucket}/slow", refresh=True)
    assert fault_proxy.counts["delays"] == counts["delays"]


def test_stop_leaves_no_server_process() -> None:
    server = S3Server.start()
    pid = server.proc.pid
    assert psutil.pid_exists(pid)
    server.stop()
    assert server.proc.returncode is not None
    assert pid not in [p.pid for p in psutil.Process().children(recursive=True)]
    assert server.log_path.read_text()  # moto's request lines went to the log, not the test output


def test_a_killed_session_leaves_no_server_process() -> None:
    """SIGKILL runs no atexit hook: the server's watchdog sees its parent gone and exits."""
    script = "import sys; sys.path.insert(0, sys.argv[1]); from s3_server import S3Server; " \
             "print(S3Server.start().proc.pid, flush=True); import time; time.sleep(600)"
    session = subprocess.Popen([sys.executable, "-c", script, str(SUPPORT)], stdout=subprocess.PIPE)
    assert session.stdout is not None
    server = psutil.Process(int(session.stdout.readline()))
    assert "moto.server" in " ".join(server.cmdline())
    session.kill()
    session.wait()
    server.wait(timeout=60)  # raises psutil.TimeoutExpired if the server outlives its session
