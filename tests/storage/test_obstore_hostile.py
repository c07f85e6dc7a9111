"""The obstore backend against a server that misbehaves (tests/storage/hostile_server.py):
short answers are retried and never handed back, a whole object sent for a range is named at
once (not read, not retried), a trickling body ends at the deadline, garbled lengths are
StorageErrors naming the URL; HTTP statuses are judged as the storage layer judges them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hostile_server import HostileServer, hostile_server, object_bytes

from shardfeed.errors import StorageError

pytest.importorskip("obstore")

from shardfeed.storage.obstore_backend import ObstoreSource

__all__ = ["hostile_server"]

SLACK_SECONDS = 2.0
"""Allowed past a stated deadline on a loaded machine."""


def test_a_short_206_is_retried_then_read_whole(hostile_server: HostileServer) -> None:
    source = ObstoreSource("s3://hostile/short.bin", backoff_seconds=0.01)
    assert source.read(5000, 100_000) == object_bytes(5000, 105_000)
    assert source.stats()["retries"] == 2
    assert hostile_server.requests.count("short.bin") == 3


def test_a_server_that_keeps_answering_short_is_an_error_not_data(
    hostile_server: HostileServer,
) -> None:
    hostile_server.short_answers = 10**6
    source = ObstoreSource("s3://hostile/short.bin", retries=4, backoff_seconds=0.01,
                           max_backoff_seconds=0.05)
    with pytest.raises(StorageError, match=r"read bytes 5000\.\.105000 of "
                                           r"'s3://hostile/short\.bin' after 5 attempts"):
        source.read(5000, 100_000)


def test_a_whole_object_for_a_range_is_named_at_once(hostile_server: HostileServer) -> None:
    source = ObstoreSource("s3://hostile/whole.bin")
    began = time.monotonic()
    with pytest.raises(StorageError) as info:
        source.read(40 << 20, 512 << 10)
    assert time.monotonic() - began < 5 + SLACK_SECONDS  # not retried until the deadline
    message = str(info.value)
    assert "s3://hostile/whole.bin" in message and "ignores Range requests" in message
    assert source.stats()["retries"] == 0


def test_a_trickling_body_ends_at_the_deadline(hostile_server: HostileServer) -> None:
    source = ObstoreSource("s3://hostile/trickle.bin", deadline_seconds=2)
    began = time.monotonic()
    with pytest.raises(StorageError, match=r"trickle\.bin.*deadline_seconds=2"):
        source.read(0, 64 << 10)
    assert time.monotonic() - began < 2 + SLACK_SECONDS


@pytest.mark.parametrize("name", ["length.bin", "chunked.bin"])
def test_a_garbled_length_is_a_storage_error_naming_the_url(
    hostile_server: HostileServer, name: str
) -> None:
    hostile_server.content_length = "-1"
    hostile_server.chunk_size_line = b"zz"
    source = ObstoreSource(f"s3://hostile/{name}", retries=1, backoff_seconds=0.01)
    with pytest.raises(StorageError, match=rf"read bytes 0\.\.16 of 's3://hostile/{name}'"):
        source.read(0, 16)


@pytest.fixture()
def status_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``s3://status/<anything>/<code>`` answers every request with HTTP ``<code>``."""
    from shardfeed.storage.remote import set_storage_options

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(int(self.path.rsplit("/", 1)[1]))
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    set_storage_options("s3://status/", key="k", secret="s", client_kwargs={
        "endpoint_url": f"http://127.0.0.1:{server.server_address[1]}",
        "region_name": "us-east-1"})
    try:
        yield "s3://status"
    finally:
        set_storage_options("s3://status/")
        server.shutdown()


def test_statuses_are_judged_whatever_the_length_of_the_key(status_server: str) -> None:
    """A 400 is not retried (its status read past obstore's long first line: a long key);
    a 503 is retried until the deadline."""
    long_key = "/".join(["k" * 60] * 6)
    refused = ObstoreSource(f"{status_server}/{long_key}/400", backoff_seconds=0.01)
    with pytest.raises(StorageError, match="answered HTTP 400"):
        refused.read(0, 10)
    assert refused.stats()["retries"] == 0
    busy = ObstoreSource(f"{status_server}/{long_key}/503", deadline_seconds=1,
                         backoff_seconds=0.01, max_backoff_seconds=0.05)
    with pytest.raises(StorageError, match="deadline_seconds=1"):
        busy.read(0, 10)
    assert busy.stats()["retries"] > 0


def test_a_region_the_server_does_not_name_is_said_at_once(status_server: str) -> None:
    """S3's answer to a request signed for the wrong region (301, no Location), from a
    server that names no region for the bucket either: the error says to give the region,
    at once, not retried."""
    source = ObstoreSource(f"{status_server}/key/301", backoff_seconds=0.01)
    with pytest.raises(StorageError, match=r"'s3://status/key/301'.*region_name"):
        source.read(0, 10)
    assert source.stats()["retries"] == 0


def test_a_failure_obstore_names_that_is_no_known_kind_is_not_retried() -> None:
    """Only the signs of no answer are retried; obstore's debug dump names its
    retry_timeout in every failure, which is not one of them."""
    from obstore.exceptions import GenericError

    from shardfeed.storage.obstore_backend import ObstoreRefused, _judged

    def fail() -> None:
        raise GenericError("Generic S3 error: something new\n\nDebug source:\nGeneric {\n"
                           "    retry_timeout: 180s,\n}")

    with pytest.raises(ObstoreRefused, match="something new"):
        _judged(fail)()


def _self_signed(folder: Any) -> tuple[str, str]:
    """A certificate for 127.0.0.1 signed by itself (a private certificate authority's
    server), and its key: PEM files in ``folder``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "server.pem", folder / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_a_private_certificate_authority_is_trusted_from_aws_ca_bundle(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An endpoint whose certificate is signed by a private authority: without it, obstore
    names the certificate at once (not 'unreachable' at the deadline); with AWS_CA_BUNDLE
    (what botocore trusts, which obstore does not read itself), it reads."""
    import ssl

    class Answer(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    cert, key = _self_signed(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    options = {"key": "k", "secret": "s", "client_kwargs": {
        "endpoint_url": f"https://127.0.0.1:{server.server_address[1]}",
        "region_name": "us-east-1"}}
    try:
        source = ObstoreSource("s3://private/obj", storage_options=options, deadline_seconds=20)
        began = time.monotonic()
        with pytest.raises(StorageError, match="certificate is not trusted.*AWS_CA_BUNDLE"):
            source.size()
        assert time.monotonic() - began < 10 and source.stats()["retries"] == 0
        monkeypatch.setenv("AWS_CA_BUNDLE", cert)
        assert ObstoreSource("s3://private/obj", storage_options=options).size() == 100
        monkeypatch.setenv("AWS_CA_BUNDLE", str(tmp_path / "missing.pem"))
        with pytest.raises(StorageError, match="missing.pem.*AWS_CA_BUNDLE"):
            ObstoreSource("s3://private/obj", storage_options=options)
    finally:
        server.shutdown()


def test_a_region_question_to_a_stalled_endpoint_does_not_hold_up_other_buckets(
    status_server: str,
) -> None:
    """One bucket's endpoint never answers the region question; another bucket's answers
    at once, and is not kept waiting behind it."""
    from stalled_server import StalledServer

    from shardfeed.storage.obstore_stores import ObstoreRefused, _learn_region

    class Named(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(301)
            self.send_header("x-amz-bucket-region", "eu-west-2")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    stalled, named = StalledServer(), ThreadingHTTPServer(("127.0.0.1", 0), Named)
    threading.Thread(target=named.serve_forever, daemon=True).start()
    failed: list[BaseException] = []

    def ask_stalled() -> None:
        try:
            _learn_region("s3://stalled-bucket/x", stalled.storage_options(),
                          deadline_seconds=8)  # the question waits up to 4 s
        except ObstoreRefused as exc:
            failed.append(exc)

    try:
        waiting = threading.Thread(target=ask_stalled)
        waiting.start()
        stalled.wait_for_connection()
        began = time.monotonic()
        region = _learn_region("s3://named-bucket/x", {"client_kwargs": {
            "endpoint_url": f"http://127.0.0.1:{named.server_address[1]}"}}, deadline_seconds=8)
        assert region == "eu-west-2" and time.monotonic() - began < 2
        waiting.join(timeout=10)
        assert failed and "region_name" in str(failed[0])
    finally:
        named.shutdown()
        stalled.stop()


def test_an_endpoint_given_in_obstores_words_is_the_one_asked() -> None:
    from shardfeed.storage.obstore_stores import _config, _endpoint

    for word in ("endpoint", "aws_endpoint", "aws_endpoint_url", "AWS_ENDPOINT", "endpoint_url"):
        config, _ = _config({"obstore_config": {word: "http://127.0.0.1:9"}})
        assert _endpoint(config) == "http://127.0.0.1:9", word
