"""What a misconfigured or hostile server does to every road, and the one rule each meets:

- malformed options (an endpoint without a scheme, a region or key no header can carry),
  and a region a server names that is none: a StorageError naming the option, never
  obstore's PanicException (a BaseException nothing upstream catches), never remembered;
- a redirect to another host: not followed with the request's credentials (the other host
  gets nothing), a StorageError that says so;
- a 206 whose body is shorter than asked: retried, then the right bytes;
- a manifest answered with 512 MiB: refused from its headers, its body not read;
- a query in an http(s) URL names the object: it is the object read.
"""

from __future__ import annotations

import re
import socket
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from shardfeed.errors import StorageError
from shardfeed.format.manifest import Manifest
from shardfeed.storage import files
from shardfeed.storage.remote import set_storage_options

pytest.importorskip("obstore")

from shardfeed.storage import redirect_guard
from shardfeed.storage.backends import unregister_backend
from shardfeed.storage.obstore_backend import ObstoreSource, use_obstore
from shardfeed.storage.process_state import PROCESS

SIZE = 1 << 20
DATA = bytes(range(256)) * (SIZE // 256)

Handler = Callable[[BaseHTTPRequestHandler], None]


class Server:
    """A threaded HTTP/1.1 server on ``host`` whose GET and HEAD answers are ``answer``;
    ``seen`` lists (method, path, headers) of every request."""

    def __init__(self, answer: Handler, host: str = "127.0.0.1") -> None:
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                outer.seen.append((self.command, self.path, dict(self.headers)))
                try:
                    answer(self)
                except (ConnectionError, BrokenPipeError):
                    pass

            do_GET = do_HEAD = do_PUT = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer((host, 0), _Handler)
        self.http.daemon_threads = True
        self.url = f"http://{host}:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture()
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Server]]:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy", "AWS_ENDPOINT_URL", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    from shardfeed.storage.process_state import SETTINGS

    saved = dict(SETTINGS.storage_options)  # e.g. the S3 test server's "s3://" options
    SETTINGS.storage_options.clear()
    made: list[Server] = []

    def make(answer: Handler, host: str = "127.0.0.1") -> Server:
        made.append(Server(answer, host))
        return made[-1]

    try:
        yield make
    finally:
        SETTINGS.storage_options.clear()
        SETTINGS.storage_options.update(saved)
        for server in made:
            server.close()


def _ranged(handler: BaseHTTPRequestHandler, *, short: bool = False) -> None:
    """206 with the range asked (``short``: half its body, Content-Length saying so)."""
    if handler.command == "HEAD":
        handler.send_response(200)
        handler.send_header("Content-Length", str(SIZE))
        handler.end_headers()
        return
    match = re.fullmatch(r"bytes=(\d+)-(\d+)", handler.headers.get("Range", ""))
    start, last = (int(match.group(1)), int(match.group(2))) if match else (0, SIZE - 1)
    body = DATA[start:last + 1]
    if short:
        body = body[:len(body) // 2]
    handler.send_response(206 if match else 200)
    if match:
        handler.send_header("Content-Range", f"bytes {start}-{last}/{SIZE}")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _options(endpoint: str, **more: Any) -> dict[str, Any]:
    return {"key": "hostile-key", "secret": "hostile-secret", "token": "SESSION-TOKEN",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}, **more}


@pytest.mark.parametrize("options", [
    {"endpoint_url": "127.0.0.1:9000"},
    {"endpoint_url": "http://[::1"},
    {"endpoint_url": "ftp://host"},
    {"endpoint_url": "http://host:port"},
    {"obstore_config": {"endpoint": "127.0.0.1:9000"}},
    {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9", "region_name": "\x7f"}},
    {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us east"}},
    {"key": "key\n", "endpoint_url": "http://127.0.0.1:9"},
    {"token": "to ken", "endpoint_url": "http://127.0.0.1:9"},
], ids=lambda o: repr(o)[:40])
def test_malformed_options_are_storage_errors_that_name_them(
        serve: Callable[..., Server], options: dict[str, Any]) -> None:
    options = {"key": "k", "secret": "s", **options}
    try:
        ObstoreSource("s3://bucket/obj", storage_options=options, retries=0,
                      deadline_seconds=2).size()
    except BaseException as exc:  # noqa: BLE001 - a PanicException is a BaseException
        assert isinstance(exc, StorageError), f"{type(exc).__name__}: {exc}"
        assert re.search(r"storage option '(endpoint|region|access_key_id|session_token)'",
                         str(exc)), str(exc)
        assert "key\n" not in str(exc) and "to ken" not in str(exc)  # no secret shown
    else:
        pytest.fail("a malformed option was taken")


def test_a_region_a_server_names_that_is_no_region_is_refused_and_not_remembered(
        serve: Callable[..., Server]) -> None:
    def moved(handler: BaseHTTPRequestHandler) -> None:  # S3's "wrong region" answer
        handler.send_response(301)  # no Location: signed for another region
        if handler.path == "/bucket":  # the question of the bucket's region
            handler.send_header("x-amz-bucket-region", "\x7f")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    server = serve(moved)
    source = ObstoreSource("s3://bucket/obj", storage_options=_options(server.url), retries=0,
                           deadline_seconds=5)
    for _ in range(2):  # and again: the bad region was not kept for the bucket
        with pytest.raises(StorageError, match="not a region name"):
            source.size()
    assert all(r != "\x7f" for r in PROCESS.regions.values())


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_to_another_host_is_not_followed_with_the_credentials(
        serve: Callable[..., Server], status: int) -> None:
    other = serve(_ranged, host="127.0.0.2")  # another host (all of 127/8 is this machine)

    def redirect(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Location", f"{other.url}{handler.path}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    origin = serve(redirect)
    source = ObstoreSource("s3://bucket/obj", storage_options=_options(origin.url), retries=0,
                           deadline_seconds=5)
    with pytest.raises(StorageError, match=r"redirected the request to 127\.0\.0\.2") as info:
        source.read(0, 1000)
    assert "never followed to another host" in str(info.value)
    assert other.seen == []  # the other host got no request, so no token
    assert [m for m, _, h in origin.seen if h.get("x-amz-security-token")] == ["GET"]


def test_a_short_body_for_a_range_is_retried_then_read_right(
        serve: Callable[..., Server]) -> None:
    answers = {"short": 2}

    def sometimes_short(handler: BaseHTTPRequestHandler) -> None:
        short = handler.command == "GET" and answers["short"] > 0
        answers["short"] -= short
        _ranged(handler, short=short)

    server = serve(sometimes_short)
    source = ObstoreSource("s3://bucket/obj", storage_options=_options(server.url),
                           backoff_seconds=0.01)
    ranges = [(0, 1000), (500_000, 100_000)]
    assert source.read_ranges(ranges) == [DATA[0:1000], DATA[500_000:600_000]]
    assert source.stats()["retries"] >= 1


def _huge(handler: BaseHTTPRequestHandler) -> None:
    """A 512 MiB answer (sent lazily; a client that reads it all takes 512 MiB)."""
    handler.send_response(200)
    handler.send_header("Content-Length", str(512 << 20))
    handler.end_headers()
    if handler.command == "GET":
        block = b" " * (1 << 20)
        for _ in range(512):
            handler.wfile.write(block)


@pytest.mark.parametrize("road", ["http", "s3"])
def test_a_manifest_answered_with_512_mib_is_refused_unread(
        serve: Callable[..., Server], road: str) -> None:
    server = serve(_huge)
    if road == "http":
        url = f"{server.url}/ds/shardfeed.json"
    else:
        set_storage_options("s3://hugebucket/", **_options(server.url))
        url = "s3://hugebucket/ds/shardfeed.json"
    try:
        tracemalloc.start()
        try:
            with pytest.raises(StorageError, match=r"more than the 268,435,456 this read"):
                Manifest.load(url)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        set_storage_options("s3://hugebucket/")
    assert peak < 64 << 20, f"{peak:,} bytes held to refuse a 512 MiB manifest"


def test_a_query_in_an_http_url_names_the_object(serve: Callable[..., Server]) -> None:
    def by_query(handler: BaseHTTPRequestHandler) -> None:
        body = b"version two" if handler.path.endswith("?v=2") else b"the latest"
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if handler.command == "GET":
            handler.wfile.write(body)

    server = serve(by_query)
    use_obstore(["http"])
    try:
        assert files.read_bytes(f"{server.url}/obj.bin?v=2") == b"version two"
        assert files.read_bytes(f"{server.url}/obj.bin") == b"the latest"
    finally:
        unregister_backend(["http"])


def test_the_refuser_answers_what_it_is_sent_and_keeps_no_credentials() -> None:
    port = redirect_guard.refuser_port()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET http://elsewhere.example/x HTTP/1.1\r\nHost: elsewhere.example\r\n"
                     b"x-amz-security-token: SECRET\r\n\r\n")
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 421 ")
    assert redirect_guard.REFUSED[-1] == "elsewhere.example"
    assert "SECRET" not in repr(list(redirect_guard.REFUSED))
