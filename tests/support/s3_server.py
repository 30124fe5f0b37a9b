"""A real S3 endpoint on loopback for the tests: moto's server mode in a subprocess of its own,
with authentication enforced, so s3fs talks to it over HTTP exactly as it talks to AWS or MinIO.

Moto lets the first ``INITIAL_NO_AUTH_ACTION_COUNT`` requests through unsigned; we spend them on
an IAM user with an allow-all policy and an access key, and every request after that must be
signed with that key (a wrong key id or secret is refused, as by S3).

    server = S3Server.start()
    bucket = server.new_bucket()
    server.fs().pipe_file(f"{bucket}/a.txt", b"hi")
    server.stop()
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from child_server import ChildServer, watched

from sparkbatch_dagster.engines.server.server_process import free_port

#: The unauthenticated calls setup makes: create_user, put_user_policy, create_access_key.
_SETUP_CALLS = 3
_POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
_counter = itertools.count()
#: ``python -m moto.server`` plus a watchdog: the server exits when its parent dies, even by
#: SIGKILL (where no atexit hook runs), so a crashed test session leaves no server behind.
_RUN_MOTO = watched("""
from moto.server import main
main(sys.argv[1:])
""")


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}; see {log}:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"moto server not listening on {port} after {timeout:.0f} s; see {log}")


class S3Server(ChildServer):
    """moto's S3 (and IAM) server on 127.0.0.1, one subprocess, real SigV4 checks.

    ``endpoint_url``, ``key``, ``secret`` and ``region`` are what a client needs; ``env()`` gives
    them as the standard AWS variables. ``log_path`` holds moto's request log (one line a request).
    """

    STOP_TIMEOUT = 5.0

    region = "us-east-1"

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.endpoint_url = f"http://127.0.0.1:{port}"
        self.key = ""
        self.secret = ""

    @classmethod
    def start(cls, timeout: float = 60.0) -> S3Server:
        """Start the server, wait until it listens, and create the access key tests sign with."""
        log_dir = Path(tempfile.mkdtemp(prefix="moto-s3-"))
        log_path = log_dir / "moto.log"
        port = free_port()
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_CALLS), "AWS_EC2_METADATA_DISABLED": "true"}
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", _RUN_MOTO, "-H", "127.0.0.1", "-p", str(port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            )
        server = cls(proc, port, log_path)
        # An interrupted test session must not leave the server running (SIGKILL: the watchdog).
        atexit.register(server.stop)
        try:
            _wait_listening(port, proc, log_path, timeout)
            server._make_key()
        except BaseException:
            server.stop()
            raise
        return server

    def _make_key(self) -> None:
        import boto3

        # Unsigned-in-effect: moto accepts any credentials for the first _SETUP_CALLS requests.
        iam = boto3.client("iam", endpoint_url=self.endpoint_url, region_name=self.region,
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="tests")
        iam.put_user_policy(UserName="tests", PolicyName="all", PolicyDocument=json.dumps(_POLICY))
        access = iam.create_access_key(UserName="tests")["AccessKey"]
        self.key, self.secret = access["AccessKeyId"], access["SecretAccessKey"]

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point boto3/s3fs at this server with the good key."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": self.region,
            # Never probe the EC2 metadata address for credentials (a slow timeout off AWS).
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, endpoint_url: str | None = None, **kw: Any) -> Any:
        """A boto3 S3 client with the good key (``endpoint_url``: another way in, e.g. a proxy;
        ``kw`` go to ``boto3.client``, e.g. ``config``)."""
        import boto3

        return boto3.client("s3", endpoint_url=endpoint_url or self.endpoint_url, region_name=self.region,
                            aws_access_key_id=self.key, aws_secret_access_key=self.secret, **kw)

    def new_bucket(self, prefix: str = "t") -> str:
        """Create a bucket with a name no other call has used; return its name."""
        name = f"{prefix}-{next(_counter)}-{uuid.uuid4().hex[:8]}".lower()
        self.client().create_bucket(Bucket=name)
        return name

    def fs(self, endpoint_url: str | None = None, **kw: Any) -> Any:
        """An ``s3fs.S3FileSystem`` on this server (or ``endpoint_url``) with the good key, uncached.

        ``kw`` go to S3FileSystem (``key``/``secret`` override the good ones, e.g. to test refusal).
        """
        import s3fs

        opts: dict[str, Any] = {"key": self.key, "secret": self.secret, "skip_instance_cache": True,
                                "client_kwargs": {"endpoint_url": endpoint_url or self.endpoint_url,
                                                  "region_name": self.region}}
        opts.update(kw)
        return s3fs.S3FileSystem(**opts)
