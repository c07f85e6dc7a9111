"""A real S3-compatible HTTP server on 127.0.0.1 (moto) for tests, reusable by every area.

The server is moto's S3 application behind werkzeug's threaded HTTP server, reached by the
same s3fs/aiobotocore client code users run. It can be stopped and started again on the same
port (the objects survive: moto keeps them in this process), and it logs every request.

Use it from another test folder by importing the fixtures into that folder's conftest.py::

    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "storage"))
    from s3_fixture import s3_server, s3_server_session  # noqa: E402,F401

then in a test::

    def test_remote_dataset(s3_server, tmp_path):
        url = s3_server.upload_folder(tmp_path / "ds")   # -> "s3://bucket-1/ds"
        ds = Dataset(url)                               # s3:// options are registered

While the session server runs: dummy credentials are in the environment, instance metadata
lookups are off, ``AWS_ENDPOINT_URL`` points at the server (so no S3 request can leave
127.0.0.1), and ``set_storage_options("s3://", ...)`` registers the endpoint with fast-failing
botocore settings. ``s3_server`` (per test) clears s3fs's instance cache and the request log.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

KEY = "testing-key"
SECRET = "testing-secret"
REGION = "us-east-1"
_SIGNED_REGION = re.compile(r"Credential=[^/]+/\d{8}/([^/]+)/s3/")


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    method: str
    path: str
    range: str | None
    query: str = ""
    authorization: str = ""


class Stall:
    """Requests whose path ends with ``suffix`` wait in :meth:`hold`, unanswered, until
    :meth:`release` or ``timeout_seconds`` (the server's threads stay bounded)."""

    def __init__(self, suffix: str, timeout_seconds: float) -> None:
        self.suffix = suffix
        self.timeout_seconds = timeout_seconds
        self.held = 0
        self._released = threading.Event()

    def hold(self, request: LoggedRequest) -> None:
        if request.method == "GET" and request.path.endswith(self.suffix):
            self.held += 1
            self._released.wait(self.timeout_seconds)

    def release(self) -> None:
        self._released.set()


class Gate:
    """Requests wait in :meth:`arrive` until ``parties`` of them are there, then all pass."""

    def __init__(self, parties: int, timeout_seconds: float) -> None:
        self.parties = parties
        self.timeout_seconds = timeout_seconds
        self.opened = False
        self.most_waiting = 0
        self._waiting = 0
        self._released = False
        self._cond = threading.Condition()

    def arrive(self) -> None:
        with self._cond:
            if self.opened or self._released:
                return
            self._waiting += 1
            self.most_waiting = max(self.most_waiting, self._waiting)
            if self._waiting >= self.parties:
                self.opened = True
                self._cond.notify_all()
            else:
                self._cond.wait_for(lambda: self.opened or self._released,
                                    self.timeout_seconds)
            self._waiting -= 1

    def release(self) -> None:
        """Let every waiting request go (the gate stays as it was: ``opened`` unchanged)."""
        with self._cond:
            self._released = True
            self._cond.notify_all()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3Server:
    """moto's S3 on ``127.0.0.1:port``; ``stop()`` also cuts open connections."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._log: list[LoggedRequest] = []
        self._log_lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        self._state_lock = threading.Lock()  # start/stop from the test and restart threads
        self._placeholder: socket.socket | None = None
        self._gate: Gate | None = None
        self._stall: Stall | None = None
        self._buckets = 0
        self.latency_seconds = 0.0  # added to every request: a cloud region's time to first byte
        self.bucket_regions: dict[str, str] = {}
        """Buckets said to be in another region than the signature's: as S3 answers a request
        signed for the wrong region (HTTP 301 with the bucket's region in a header; a
        region of "?" gives no header)."""

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Listen (again) on the port; a no-op while running."""
        with self._state_lock:
            if self._server is None:
                self._start()

    def _start(self) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        owner = self
        app = DomainDispatcherApplication(create_backend_app)

        def logging_app(environ: dict[str, Any], start_response: Any) -> Any:
            request = LoggedRequest(
                environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                environ.get("HTTP_RANGE"), environ.get("QUERY_STRING", ""),
                environ.get("HTTP_AUTHORIZATION", ""),
            )
            with owner._log_lock:
                owner._log.append(request)
                gate = owner._gate
                stall = owner._stall
            if owner.latency_seconds:
                time.sleep(owner.latency_seconds)
            moved = owner._moved(request)
            if moved is not None:
                return moved(start_response)
            if gate is not None and request.range is not None:
                gate.arrive()
            if stall is not None:
                stall.hold(request)
            return app(environ, start_response)

        class Handler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass  # keep test output clean

            def setup(self) -> None:
                super().setup()
                with owner._conn_lock:
                    owner._connections.add(self.connection)

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    with owner._conn_lock:
                        owner._connections.discard(self.connection)

        server = make_server(
            "127.0.0.1", self.port, logging_app, threaded=True, request_handler=Handler
        )
        self._release_port()  # the listener holds the port now
        self._server = server
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="moto-s3", daemon=True
        )
        self._thread.start()

    def _moved(self, request: LoggedRequest) -> Callable[[Any], list[bytes]] | None:
        """S3's answer to a request for a bucket of ``bucket_regions`` that is not signed for
        its region (an unsigned HEAD of the bucket included: how its region is looked up)."""
        bucket = request.path.lstrip("/").split("/", 1)[0]
        region = self.bucket_regions.get(bucket)
        if region is None:
            return None
        signed = _SIGNED_REGION.search(f"{request.authorization} {unquote(request.query)}")
        if signed is not None and signed.group(1) == region:
            return None
        body = b"" if request.method == "HEAD" else (
            b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>PermanentRedirect</Code>"
            b"<Message>The bucket you are attempting to access must be addressed using the "
            b"specified endpoint. Please send all future requests to this endpoint.</Message>"
            b"<Bucket>" + bucket.encode() + b"</Bucket></Error>")

        headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
        if region != "?":
            headers.append(("x-amz-bucket-region", region))

        def answer(start_response: Any) -> list[bytes]:
            start_response("301 Moved Permanently", headers)
            return [body]

        return answer

    def stop(self) -> None:
        """Stop listening and cut every open connection (clients see refused/reset).

        The port stays reserved while the server is down (a bound socket that does not
        listen: connections are refused), so no other process can take it before
        :meth:`start`.
        """
        with self._state_lock:
            server, self._server = self._server, None
            if server is None:
                return
            server.shutdown()
            server.server_close()
            self._reserve_port()
            with self._conn_lock:
                for conn in list(self._connections):
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            if self._thread is not None:
                self._thread.join(timeout=30)

    def close(self) -> None:
        """Stop for good: the port is released."""
        self.stop()
        with self._state_lock:
            self._release_port()

    def _reserve_port(self) -> None:
        placeholder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            placeholder.bind(("127.0.0.1", self.port))
        except OSError:
            placeholder.close()
            return
        self._placeholder = placeholder

    def _release_port(self) -> None:
        placeholder, self._placeholder = self._placeholder, None
        if placeholder is not None:
            placeholder.close()

    def restart_later(self, delay_seconds: float) -> threading.Thread:
        """Start the server again on the same port after ``delay_seconds``, in a thread.

        Prefer :meth:`start_when`: a fixed delay races the client's retry budget on a
        loaded machine."""
        done = threading.Event()

        def run() -> None:
            done.wait(delay_seconds)
            self.start()

        thread = threading.Thread(target=run, name="moto-restart", daemon=True)
        thread.start()
        return thread

    def start_when(self, condition: Callable[[], bool], *,
                   timeout_seconds: float = 60.0) -> threading.Thread:
        """Start the server again once ``condition()`` holds (checked every 10 ms), or after
        ``timeout_seconds`` at the latest: wait on what the test needs to have happened
        (a client retrying) instead of a guessed delay."""
        def run() -> None:
            deadline = time.monotonic() + timeout_seconds
            while not condition() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.start()

        thread = threading.Thread(target=run, name="moto-start-when", daemon=True)
        thread.start()
        return thread

    @property
    def running(self) -> bool:
        return self._server is not None

    # -- requests log ---------------------------------------------------------------------

    def requests(self, method: str | None = None) -> list[LoggedRequest]:
        with self._log_lock:
            return [r for r in self._log if method is None or r.method == method]

    @contextlib.contextmanager
    def gate_ranged_gets(self, parties: int, *, timeout_seconds: float = 5.0) -> Iterator[Gate]:
        """Hold each ranged GET until ``parties`` of them are waiting at once (or it has
        waited ``timeout_seconds``, less than the clients' read timeout): ``gate.opened``
        and ``gate.most_waiting`` then say how many requests the client had in flight at
        once. A client sending one request after another waits out every timeout."""
        gate = Gate(parties, timeout_seconds)
        with self._log_lock:
            self._gate = gate
        try:
            yield gate
        finally:
            with self._log_lock:
                self._gate = None
            gate.release()

    @contextlib.contextmanager
    def stall_gets(self, suffix: str, *, timeout_seconds: float = 60.0) -> Iterator[Stall]:
        """Inside the block, GETs of objects whose path ends with ``suffix`` get no answer
        (each is held at most ``timeout_seconds``); other requests are served. A server that
        stalls mid-stream: the manifest and indexes come, the shards' bytes never do."""
        stall = Stall(suffix, timeout_seconds)
        with self._log_lock:
            self._stall = stall
        try:
            yield stall
        finally:
            with self._log_lock:
                self._stall = None
            stall.release()

    def clear_log(self) -> None:
        with self._log_lock:
            self._log.clear()

    # -- clients and data -----------------------------------------------------------------

    def storage_options(self) -> dict[str, Any]:
        """s3fs options for this server, failing fast when it is down."""
        return {
            "key": KEY,
            "secret": SECRET,
            "client_kwargs": {"endpoint_url": self.endpoint_url},
            "config_kwargs": {
                "retries": {"total_max_attempts": 1},
                "connect_timeout": 2,
                "read_timeout": 10,
            },
        }

    def filesystem(self) -> S3Files:
        """The objects of this server for a test to set up and look at (boto3: no s3fs, so
        the suites run where only shardfeed's own road to S3 is installed)."""
        return S3Files(self.endpoint_url)

    def new_bucket(self, prefix: str = "bucket") -> str:
        """Create a fresh bucket (``prefix-1``, ``prefix-2``, ...) and return its name."""
        self._buckets += 1
        name = f"{prefix}-{self._buckets}"
        self.filesystem().mkdir(name)
        return name

    def upload_folder(self, folder: str | os.PathLike[str], bucket: str | None = None,
                      prefix: str | None = None) -> str:
        """Upload every file under ``folder`` to ``s3://bucket/prefix/...``; return that URL.

        ``bucket`` defaults to a new one, ``prefix`` to the folder's name.
        """
        root = Path(folder)
        bucket = bucket or self.new_bucket()
        prefix = root.name if prefix is None else prefix.strip("/")
        fs = self.filesystem()
        for path in sorted(root.rglob("*")):
            if path.is_file():
                rel = path.relative_to(root).as_posix()
                key = f"{bucket}/{prefix}/{rel}" if prefix else f"{bucket}/{rel}"
                fs.put_file(str(path), key)
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"


class S3Files:
    """The few file-system calls tests make on the server (``bucket/key`` paths, as s3fs
    names them), through boto3."""

    def __init__(self, endpoint_url: str) -> None:
        import boto3

        self._s3 = boto3.client("s3", endpoint_url=endpoint_url, aws_access_key_id=KEY,
                                aws_secret_access_key=SECRET, region_name=REGION)

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        bucket, _, key = path.removeprefix("s3://").partition("/")
        return bucket, key

    def mkdir(self, bucket: str) -> None:
        self._s3.create_bucket(Bucket=bucket)

    def put_file(self, local: str, path: str) -> None:
        bucket, key = self._split(path)
        self._s3.upload_file(str(local), bucket, key)

    def pipe_file(self, path: str, data: bytes) -> None:
        bucket, key = self._split(path)
        self._s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        bucket, key = self._split(path)
        extra = {} if start is None else {"Range": f"bytes={start}-{'' if end is None else end - 1}"}
        return bytes(self._s3.get_object(Bucket=bucket, Key=key, **extra)["Body"].read())

    def find(self, path: str) -> list[str]:
        """Every object under ``path``, as ``bucket/key``."""
        bucket, key = self._split(path)
        prefix = key.rstrip("/") + "/" if key else ""
        found = []
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                         Prefix=prefix):
            found += [f"{bucket}/{o['Key']}" for o in page.get("Contents", [])]
        return sorted(found)

    def ls(self, path: str, detail: bool = False, refresh: bool = False) -> list[str]:
        """The objects and folders directly under ``path``, as ``bucket/key``."""
        bucket, key = self._split(path)
        prefix = key.rstrip("/") + "/" if key else ""
        page = self._s3.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/")
        names = [f"{bucket}/{o['Key']}" for o in page.get("Contents", [])]
        names += [f"{bucket}/{p['Prefix'].rstrip('/')}" for p in page.get("CommonPrefixes", [])]
        return sorted(names)

    def exists(self, path: str) -> bool:
        bucket, key = self._split(path)
        try:
            self._s3.head_object(Bucket=bucket, Key=key)
            return True
        except self._s3.exceptions.ClientError:
            return bool(self.find(path))

    def rm(self, path: str | list[str], recursive: bool = False) -> None:
        for one in [path] if isinstance(path, str) else path:
            bucket, key = self._split(one)
            keys = [p.split("/", 1)[1] for p in self.find(one)] if recursive else []
            for k in keys or [key]:
                self._s3.delete_object(Bucket=bucket, Key=k)

    def invalidate_cache(self, path: str | None = None) -> None:
        """(nothing is cached)"""


def clear_s3fs_instances() -> None:
    """Forget s3fs's clients (each test gets fresh ones), where s3fs is installed."""
    try:
        import s3fs
    except ImportError:
        return
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def s3_server_session() -> Iterator[S3Server]:
    """One moto S3 server for the session, with a safe environment (see module docstring)."""
    pytest.importorskip("moto")
    from shardfeed.storage.remote import set_storage_options

    server = S3Server()
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                     "AWS_ENDPOINT_URL_S3", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy",
                     "https_proxy", "ALL_PROXY", "all_proxy"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", KEY)
        mp.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        mp.setenv("AWS_DEFAULT_REGION", REGION)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        mp.setenv("AWS_CONFIG_FILE", os.devnull)
        mp.setenv("AWS_ENDPOINT_URL", server.endpoint_url)
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")
        server.start()
        set_storage_options("s3://", **server.storage_options())
        try:
            yield server
        finally:
            set_storage_options("s3://")
            server.close()
            clear_s3fs_instances()


@pytest.fixture()
def s3_server(s3_server_session: S3Server) -> Iterator[S3Server]:
    """The session's S3 server, running, with a fresh s3fs instance cache and request log."""
    server = s3_server_session
    if not server.running:
        server.start()
    clear_s3fs_instances()
    server.clear_log()
    server.latency_seconds = 0.0
    yield server
    server.latency_seconds = 0.0
    if not server.running:
        server.start()
    clear_s3fs_instances()
