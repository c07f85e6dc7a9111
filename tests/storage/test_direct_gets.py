"""Ranged GETs by presigned URL (storage/direct_gets.py): the same bytes as s3fs, used only
where a plain GET is all s3fs would send, and every failure with the storage layer's meaning."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from shardfeed.errors import StorageError
from shardfeed.storage import http1
from shardfeed.storage.direct_gets import DirectGets, HttpStatusError, direct_gets_for
from shardfeed.storage.failures import is_transient
from shardfeed.storage.options import filesystem
from shardfeed.storage.remote import RemoteSource

DATA = os.urandom(300_000)
RANGES = [(0, 10), (5, 1000), (299_990, 10), (299_990, 500), (300_000, 10), (123, 0),
          (0, 300_000), (150_000, 100_000)]


@pytest.fixture
def object_url(s3_server: Any) -> str:
    bucket = s3_server.new_bucket("direct")
    s3_server.filesystem().pipe(f"{bucket}/obj.bin", DATA)
    s3_server.clear_log()
    return f"s3://{bucket}/obj.bin"


def test_s3_ranges_are_read_by_presigned_url_and_match_s3fs(s3_server: Any,
                                                             object_url: str) -> None:
    direct = RemoteSource(object_url)
    expected = [DATA[o : o + n] for o, n in RANGES]
    assert direct.read_ranges(RANGES) == expected
    assert [direct.read(o, n) for o, n in RANGES] == expected
    gets = s3_server.requests("GET")
    assert gets and all("Signature=" in g.query for g in gets)  # signed in the URL
    s3_server.clear_log()
    plain = RemoteSource(object_url, direct_gets=False)
    assert plain.read_ranges(RANGES) == expected
    assert not any("Signature=" in g.query for g in s3_server.requests("GET"))


def test_a_missing_object_is_a_clear_storage_error(object_url: str) -> None:
    remote = RemoteSource(object_url.replace("obj.bin", "gone.bin"))
    with pytest.raises(StorageError, match=r"gone\.bin.*does not exist"):
        remote.read(0, 10)


def test_options_that_need_more_than_a_get_stay_on_s3fs(
    s3_server: Any, object_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = s3_server.storage_options()

    def direct(**extra: Any) -> DirectGets | None:
        fs, path = filesystem(object_url, {**base, **extra})
        return direct_gets_for(fs, path)

    assert direct() is not None
    assert direct(requester_pays=True) is None
    assert direct(s3_additional_kwargs={"SSECustomerAlgorithm": "AES256"}) is None
    assert direct(version_aware=True) is None
    assert direct(client_kwargs={**base["client_kwargs"], "verify": False}) is None
    assert direct(config_kwargs={**base["config_kwargs"],
                                 "proxies": {"http": "http://proxy:3128"}}) is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert direct() is None
    monkeypatch.delenv("HTTPS_PROXY")
    fs, path = filesystem("memory://x/obj.bin")
    assert direct_gets_for(fs, path) is None
    fs, path = filesystem(object_url, base)
    assert direct_gets_for(fs, path, enabled=False) is None


# -- failures, against a server that answers as told ----------------------------------------


class Script:
    """What the server answers: ``answer(query, range) -> (status, headers, body)``."""

    def __init__(self) -> None:
        self.answer: Callable[[str, str], tuple[int, dict[str, str], bytes]] = _ranged
        self.close_after = False  # drop the connection after answering, without saying so
        self.seen: list[str] = []
        self.raw: bytes | None = None  # sent as the whole answer, as it is
        self.hold_seconds = 0.0  # wait this long after a raw answer, the connection open


def _ranged(query: str, rng: str) -> tuple[int, dict[str, str], bytes]:
    start, end = (int(v) for v in rng.removeprefix("bytes=").split("-"))
    if start >= len(DATA):
        return 416, {}, b"<Error><Code>InvalidRange</Code></Error>"
    end = min(end, len(DATA) - 1)
    return 206, {"Content-Range": f"bytes {start}-{end}/{len(DATA)}"}, DATA[start : end + 1]


@pytest.fixture(params=["compiled", "python"])
def scripted(request: pytest.FixtureRequest,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Script, str]]:
    """A server answering as its Script says; each test runs with bodies received by the
    compiled ``_recv`` and by the Python path."""
    if request.param == "python":
        monkeypatch.setattr(http1, "_recv", None)
    else:
        assert http1._recv is not None, "shardfeed.storage._recv was not built"
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            _, _, query = self.path.partition("?")
            script.seen.append(query)
            if script.raw is not None:
                self.wfile.write(script.raw)
                self.wfile.flush()
                time.sleep(script.hold_seconds)
                self.close_connection = script.close_after
                return
            status, headers, body = script.answer(query, self.headers.get("Range", ""))
            self.send_response(status)
            headers.setdefault("Content-Length", str(len(body)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = script.close_after

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield script, f"http://127.0.0.1:{server.server_address[1]}/bucket/obj.bin"
    finally:
        server.shutdown()
        server.server_close()


class SigningFs:
    """A filesystem whose presigned URLs carry a new signature each time."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.signed = 0

    def url(self, path: str, expires: int) -> str:
        self.signed += 1
        return f"{self.base}?sig={self.signed}"


def _gets(url: str) -> tuple[DirectGets, SigningFs]:
    fs = SigningFs(url)
    return DirectGets(fs, "bucket/obj.bin", timeout_seconds=5.0), fs


def test_ranges_past_the_end_and_whole_answers(scripted: tuple[Script, str]) -> None:
    script, url = scripted
    gets, _ = _gets(url)
    assert gets.get(10, 20) == DATA[10:20]
    assert gets.get(299_990, 300_500) == DATA[299_990:]
    assert gets.get(300_000, 300_010) == b""  # 416: past the end reads as empty
    script.answer = lambda q, r: (200, {}, DATA)  # a server that ignores Range
    assert gets.get(1000, 1010) == DATA[1000:1010]
    script.answer = lambda q, r: (206, {"Content-Range": "bytes 0-9/300000"}, DATA[:10])
    with pytest.raises(HttpStatusError, match="Content-Range") as wrong:
        gets.get(50, 60)  # an answer for other bytes is never handed back
    assert is_transient(wrong.value)


def test_a_refused_signature_is_renewed_once(scripted: tuple[Script, str]) -> None:
    script, url = scripted
    script.answer = lambda q, r: (403, {}, b"<Error><Code>AccessDenied</Code></Error>") \
        if q == "sig=1" else _ranged(q, r)
    gets, fs = _gets(url)
    assert gets.get(0, 100) == DATA[:100]
    assert fs.signed == 2 and script.seen == ["sig=1", "sig=2"]
    script.answer = lambda q, r: (403, {}, (b"<Error><Code>AccessDenied</Code>"
                                  b"<Message>no</Message></Error>"))
    with pytest.raises(PermissionError, match="AccessDenied: no") as denied:
        gets.get(0, 100)
    assert not is_transient(denied.value)
    assert fs.signed == 3  # signed again once, then given up


@pytest.mark.parametrize(("status", "transient", "kind"), [
    (404, False, FileNotFoundError), (500, True, HttpStatusError),
    (503, True, HttpStatusError), (429, True, HttpStatusError), (400, False, HttpStatusError),
])
def test_statuses_keep_their_meaning(scripted: tuple[Script, str], status: int,
                                     transient: bool, kind: type[BaseException]) -> None:
    script, url = scripted
    script.answer = lambda q, r: (status, {}, b"<Error><Code>Code" + str(status).encode()
                                  + b"</Code></Error>")
    gets, _ = _gets(url)
    with pytest.raises(kind, match=f"Code{status}") as failed:
        gets.get(0, 10)
    assert is_transient(failed.value) is transient


def test_a_cut_body_is_a_transient_connection_error(scripted: tuple[Script, str]) -> None:
    script, url = scripted
    script.answer = lambda q, r: (206, {"Content-Length": "1000",
                                        "Content-Range": "bytes 0-999/300000"}, DATA[:500])
    script.close_after = True
    gets, _ = _gets(url)
    with pytest.raises(ConnectionError) as cut:
        gets.get(0, 1000)
    assert is_transient(cut.value)


def test_a_body_that_stops_coming_is_a_transient_error_after_the_timeout(
    scripted: tuple[Script, str]
) -> None:
    script, url = scripted
    script.raw = (b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-99999/300000\r\n"
                  b"Content-Length: 100000\r\n\r\n" + DATA[:40_000])
    script.hold_seconds = 3.0
    gets = DirectGets(SigningFs(url), "bucket/obj.bin", timeout_seconds=0.5)
    began = time.monotonic()
    with pytest.raises(OSError) as stalled:
        gets.get(0, 100_000)
    assert time.monotonic() - began < 2.5  # the timeout, not the server's hold
    assert is_transient(stalled.value)


def test_a_long_body_arrives_whole(scripted: tuple[Script, str]) -> None:
    script, url = scripted
    gets, _ = _gets(url)
    assert gets.get(0, 300_000) == DATA  # many receives, one bytes object
    script.raw = (b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 7-10/300000\r\n"
                  b"Content-Length: 4\r\n\r\n" + DATA[7:11] + b"HTTP/1.1 206")
    script.close_after = True
    assert gets.get(7, 11) == DATA[7:11]  # bytes past the body are not part of it


def test_a_kept_alive_connection_the_server_dropped_is_replaced(
    scripted: tuple[Script, str]
) -> None:
    script, url = scripted
    script.close_after = True  # closes after each answer, yet says keep-alive
    gets, _ = _gets(url)
    for k in range(5):
        assert gets.get(k * 10, k * 10 + 10) == DATA[k * 10 : k * 10 + 10]
    assert len(script.seen) == 5  # no request lost or sent twice


def test_a_refused_connection_names_the_endpoint() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gets, _ = _gets(f"http://127.0.0.1:{port}/bucket/obj.bin")
    with pytest.raises(ConnectionRefusedError, match=f"endpoint http://127.0.0.1:{port}") as e:
        gets.get(0, 10)
    assert is_transient(e.value)


def test_chunked_answers_and_http_1_0(scripted: tuple[Script, str]) -> None:
    script, url = scripted
    gets, _ = _gets(url)
    script.raw = (b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-19/300000\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n4\r\n" + DATA[10:14] + b"\r\n"
                  b"6;ext=1\r\n" + DATA[14:20] + b"\r\n0\r\nX-Trailer: 1\r\n\r\n")
    assert gets.get(10, 20) == DATA[10:20]
    assert gets.get(10, 20) == DATA[10:20]  # the same connection, kept alive after it
    script.raw = (b"HTTP/1.0 206 Partial Content\r\nContent-Range: bytes 0-4/300000\r\n\r\n"
                  + DATA[:5])  # no length: the body runs to the end of the connection
    script.close_after = True
    assert gets.get(0, 5) == DATA[:5]


@pytest.mark.parametrize("raw", [
    b"SMTP ready\r\n\r\n",  # not HTTP
    b"HTTP/1.1 206 Partial\r\nno colon here\r\n\r\n",  # a garbled header
    b"HTTP/1.1 206 Partial\r\nX-Pad: " + b"x" * (70 << 10) + b"\r\n\r\n",  # endless headers
    b"HTTP/1.1 206 Partial\r\nContent-Length: 5000\r\n\r\n" + DATA[:5000],  # over the range
    b"HTTP/1.1 206 Partial\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # bad chunk size
])
def test_a_garbled_answer_is_a_transient_connection_error(scripted: tuple[Script, str],
                                                         raw: bytes) -> None:
    script, url = scripted
    script.raw, script.close_after = raw, True
    gets, _ = _gets(url)
    with pytest.raises(ConnectionError, match="127.0.0.1") as bad:
        gets.get(0, 100)
    assert is_transient(bad.value)


def test_a_whole_object_answer_is_read_only_up_to_the_range(scripted: tuple[Script, str]) -> None:
    """A server that ignores Range and sends a huge object: the client reads the bytes it
    needs and drops the connection, rather than the whole body."""
    script, url = scripted
    huge = 1 << 30
    script.raw = (f"HTTP/1.1 200 OK\r\nContent-Length: {huge}\r\n\r\n".encode()
                  + DATA[:4096])  # promises 1 GiB, sends 4 KiB and waits
    gets, _ = _gets(url)
    assert gets.get(100, 200) == DATA[100:200]
    script.raw = None
    assert gets.get(0, 10) == DATA[:10]  # on a new connection: the first one was dropped


def test_a_whole_object_answer_in_any_framing_gives_the_range_asked(
    scripted: tuple[Script, str]
) -> None:
    """A 200 (the server ignored Range) chunked, or running to the end of the connection:
    the bytes before the range are dropped, the range handed back, whatever the chunks."""
    script, url = scripted
    gets, _ = _gets(url)
    chunks = b"".join(b"%x\r\n" % len(DATA[a:b]) + DATA[a:b] + b"\r\n"
                      for a, b in [(0, 7), (7, 8), (8, 30), (30, 4000)])
    script.raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    script.close_after = True
    for start, end in [(5, 17), (0, 7), (7, 8), (29, 31), (100, 4000), (3990, 5000)]:
        assert gets.get(start, end) == DATA[start : min(end, 4000)], (start, end)
    assert gets.get(4000, 4010) == b""  # the object ends before the range
    script.raw = b"HTTP/1.0 200 OK\r\n\r\n" + DATA[:4000]  # no length: up to the close
    assert gets.get(3000, 3100) == DATA[3000:3100]
    assert gets.get(3990, 4100) == DATA[3990:4000]
    assert gets.get(5000, 5100) == b""


def test_a_206_with_fewer_bytes_than_its_content_range_is_a_short_answer(
    scripted: tuple[Script, str]
) -> None:
    script, url = scripted
    gets, _ = _gets(url)
    script.answer = lambda q, r: (206, {"Content-Range": "bytes 0-99/300000"}, DATA[:60])
    with pytest.raises(ConnectionError, match=r"short answer.*60 bytes for bytes 0\.\.100") \
            as short:
        gets.get(0, 100)
    assert is_transient(short.value)
    script.answer = lambda q, r: (206, {"Content-Range": "bytes 0-49/300000"}, DATA[:50])
    with pytest.raises(ConnectionError, match=r"short answer.*bytes 0\.\.50 .*0\.\.100 asked"):
        gets.get(0, 100)
    script.answer = lambda q, r: (206, {"Content-Range": "bytes 0-199/300000"}, DATA[:100])
    with pytest.raises(HttpStatusError, match="Content-Range"):  # more than asked
        gets.get(0, 100)
