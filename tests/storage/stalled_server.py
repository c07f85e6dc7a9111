"""A TCP server on 127.0.0.1 that accepts connections and never answers: a stalled endpoint.

It reads and drops whatever clients send and holds their connections open, so a client
waits for an answer that never comes (what a hung proxy or an overloaded gateway does). Its
one thread is bounded in time: it stops by itself after ``lifetime_seconds``, or at
:meth:`StalledServer.stop`, closing every connection.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from poll_sockets import Connection, PollServer

KEY = "stalled-key"
SECRET = "stalled-secret"


class StalledServer(PollServer):
    """Listens on ``127.0.0.1:port``; ``connections`` counts the connections accepted,
    ``open_connections`` those not yet closed by their client. Reads what clients send and
    never answers."""

    def __init__(self, *, lifetime_seconds: float = 120.0) -> None:
        super().__init__(lifetime_seconds=lifetime_seconds, thread_name="stalled-server")
        self.start()

    def received(self, conn: Connection) -> None:
        conn.request.clear()  # read the request, never answer it

    def wait_for_connection(self, timeout_seconds: float = 30.0) -> None:
        """Return once a client has connected (the read under test is waiting)."""
        ends = time.monotonic() + timeout_seconds
        while self.connections == 0 and time.monotonic() < ends:
            time.sleep(0.01)
        assert self.connections > 0, "no client connected to the stalled server"

    def set_up_client(self, url: str, deadline_seconds: float) -> None:
        """Make the s3fs client the storage layer will read ``url`` with under
        ``deadline_seconds`` (fsspec keeps it), before a test starts its clock: botocore
        loads megabytes of service models for each new client, seconds in a loaded test
        process, and a test of the endpoint's stall must time the endpoint. Signs a URL
        (local: no request is sent)."""
        from shardfeed.storage.options import filesystem

        fs, path = filesystem(url, deadline_seconds=deadline_seconds)
        fs.url(path, expires=60)

    def storage_options(self) -> dict[str, Any]:
        """s3fs options that send every request here, with the client's default timeouts
        (what a user who only set the endpoint has)."""
        return {
            "key": KEY,
            "secret": SECRET,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
            "config_kwargs": {},
        }



def _as_from_a_shell() -> None:
    """In a child, before it runs: Ctrl-C as a shell leaves it to a program it starts (its
    default action, not blocked). A test process may have it blocked or ignored where a
    library it ran did so (a child inherits both across exec), and its Ctrl-C would never
    reach the program under test."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args: list[str], **options: Any) -> subprocess.Popen[str]:
    """``subprocess.Popen(args, ...)`` of a program as a user starts it from a shell (see
    :func:`_as_from_a_shell`), its output and errors piped as text."""
    # the child only unblocks a signal and sets its action before it runs the program
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_from_a_shell, **options)  # noqa: PLW1509


def _signals(pid: int) -> str:
    """The blocked, ignored and caught signals of process ``pid`` (Linux), for a message."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return " ".join(line.strip() for line in status
                            if line.startswith(("SigBlk", "SigIgn", "SigCgt", "State")))
    except OSError:
        return "(its status is not readable)"


def interrupt(proc: subprocess.Popen[str], *, wait_seconds: float = 20.0) -> tuple[float, str]:
    """Send Ctrl-C (SIGINT) to ``proc`` and wait for it to end: the seconds it took, and its
    stderr. Fails the test if it is still running after ``wait_seconds``; never leaves it
    running."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=wait_seconds)
    except subprocess.TimeoutExpired:
        state = _signals(proc.pid)
        proc.kill()
        proc.wait()
        pytest.fail(f"the process did not end within {wait_seconds:g} s of Ctrl-C ({state})")
    took = time.monotonic() - sent
    _, stderr = proc.communicate()
    return took, stderr

@pytest.fixture()
def stalled_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[StalledServer]:
    """A stalled endpoint; ``s3://stalled-bucket/`` is registered to point at it.

    No S3 request can leave 127.0.0.1: the credentials are given, and instance metadata
    lookups are off.
    """
    pytest.importorskip("s3fs")
    from shardfeed.storage.remote import set_storage_options

    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    server = StalledServer()
    set_storage_options("s3://stalled-bucket/", **server.storage_options())
    try:
        yield server
    finally:
        set_storage_options("s3://stalled-bucket/")
        server.stop()
