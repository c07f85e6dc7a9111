"""Secrets carried in URLs (presigned signatures, credentials, tokens, passwords) never reach
a StorageError, its chain of causes or the DEBUG log: unit tests of ``redact`` and
``redacted_exception``, then what a user sees when a presigned URL is refused (403) or fails
(500) on a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import errno
import http.server
import logging
import threading
import traceback
from collections.abc import Iterator

import pytest

from shardfeed.errors import ShardChangedError, StorageError
from shardfeed.storage import open_source
from shardfeed.storage.backends import registered, unregister_backend
from shardfeed.storage.failures import (
    RedactedError,
    describe,
    is_transient,
    redact,
    redacted_exception,
    storage_error,
)
from shardfeed.storage.files import read_bytes, retry_policy
from shardfeed.storage.retry import RetryPolicy
from shardfeed.storage.versions import changed_error

SIGNATURE = "deadbeef" * 8
TOKEN = "FwoGZXIvYXdzEJr%2F%2F%2F%2F%2F%2F%2F%2F%2FwEaDEXAMPLEtoken%3D"
ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRETS = (SIGNATURE, TOKEN, ACCESS_KEY)

S3_V4 = (
    "https://examplebucket.s3.amazonaws.com/shards/train-00000.shard?"
    "X-Amz-Algorithm=AWS4-HMAC-SHA256"
    f"&X-Amz-Credential={ACCESS_KEY}%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
    "&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
    f"&X-Amz-Security-Token={TOKEN}&X-Amz-Signature={SIGNATURE}"
)
GCS_V4 = (
    "https://storage.googleapis.com/example-bucket/shards/train-00000.shard?"
    "X-Goog-Algorithm=GOOG4-RSA-SHA256"
    "&X-Goog-Credential=loader%40example-project.iam.gserviceaccount.com%2F20260101%2Fauto"
    "%2Fstorage%2Fgoog4_request&X-Goog-Date=20260101T000000Z&X-Goog-Expires=900"
    f"&X-Goog-SignedHeaders=host&X-Goog-Signature={SIGNATURE}"
)
AZURE_SAS = (
    "https://account.blob.core.windows.net/container/shards/train-00000.shard?"
    "sv=2022-11-02&ss=b&srt=o&sp=r&se=2026-01-02T00%3A00%3A00Z&st=2026-01-01T00%3A00%3A00Z"
    "&spr=https&sig=Z%2FRHIX5Xcg0Mq2rqI3OlWTjEg2tYkboXr1P9ZUXDtkk%3D"
)


# -- redact ----------------------------------------------------------------------------------


def test_redact_s3_presigned_url_keeps_names_host_path_and_the_harmless_parameters() -> None:
    text = redact(S3_V4)
    assert not any(secret in text for secret in SECRETS)
    assert text == (
        "https://examplebucket.s3.amazonaws.com/shards/train-00000.shard?"
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=REDACTED"
        "&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
        "&X-Amz-Security-Token=REDACTED&X-Amz-Signature=REDACTED"
    )


def test_redact_gcs_v4_signed_url() -> None:
    text = redact(GCS_V4)
    assert SIGNATURE not in text and "iam.gserviceaccount.com" not in text
    assert "X-Goog-Credential=REDACTED&" in text and text.endswith("X-Goog-Signature=REDACTED")
    assert "X-Goog-Expires=900&" in text
    assert text.startswith("https://storage.googleapis.com/example-bucket/shards/train-00000")


def test_redact_azure_sas_hides_sig_only() -> None:
    text = redact(AZURE_SAS)
    assert text.endswith("&spr=https&sig=REDACTED")
    assert "sv=2022-11-02&ss=b&srt=o&sp=r&se=2026-01-02T00%3A00%3A00Z" in text
    assert "Z%2FRHIX5" not in text


def test_redact_s3_v2_presigned_url_and_names_in_any_case() -> None:
    url = (f"https://b.s3.amazonaws.com/k?AWSAccessKeyId={ACCESS_KEY}&Expires=1767225600"
           f"&Signature=vjbyPxybdZaNmGa%2ByT272YEAiv4%3D&x-amz-security-token={TOKEN}")
    assert redact(url) == (
        f"https://b.s3.amazonaws.com/k?AWSAccessKeyId={ACCESS_KEY}&Expires=1767225600"
        "&Signature=REDACTED&x-amz-security-token=REDACTED"
    )
    assert redact("http://h/o?SIG=abc&Token=t&API_KEY=k&key=k2&access_token=a&keep=1") == (
        "http://h/o?SIG=REDACTED&Token=REDACTED&API_KEY=REDACTED&key=REDACTED"
        "&access_token=REDACTED&keep=1"
    )


def test_redact_password_in_the_authority() -> None:
    assert redact("cannot read 'https://alice:p@ss:w0rd@host.example:8443/b/o': refused") \
        == "cannot read 'https://REDACTED@host.example:8443/b/o': refused"
    assert redact("ftp://alice:secret@host/path?X-Amz-Signature=abc") == (
        "ftp://REDACTED@host/path?X-Amz-Signature=REDACTED")
    assert redact("mail alice@example.com") == "mail alice@example.com"


def test_redact_urls_inside_messages_reprs_and_xml() -> None:
    quoted = f"403, message='Forbidden', url='{S3_V4}'"
    assert redact(quoted).endswith("X-Amz-Signature=REDACTED'")
    escaped = repr({"url": f"it's {S3_V4}"})  # a repr with an escaped quote
    assert SIGNATURE not in redact(escaped)
    xml = f"<Error><URL>{S3_V4.replace('&', '&amp;')}</URL></Error>"
    out = redact(xml)
    assert not any(secret in out for secret in SECRETS)
    assert out.endswith("&amp;X-Amz-Signature=REDACTED</URL></Error>")


def test_redact_leaves_other_text_alone_and_is_cheap_without_query_or_at() -> None:
    text = "cannot read 's3://bucket/shards/train.shard': timed out; retry"
    assert redact(text) is text
    assert redact("") == ""
    assert redact("http://h/o?a=1&b=2") == "http://h/o?a=1&b=2"
    assert redact("http://h/o?sig=") == "http://h/o?sig="  # no value, nothing to hide


class _Unreadable(str):
    def __contains__(self, key: object) -> bool:
        raise RuntimeError("cannot look")


def test_redact_never_raises_and_never_leaks() -> None:
    text = redact(_Unreadable(S3_V4))
    assert SIGNATURE not in text and "withheld" in text


# -- redacted_exception and the messages built here ------------------------------------------


def test_a_clean_chain_is_returned_as_is() -> None:
    exc = ConnectionError("connection refused by 127.0.0.1:9000")
    exc.__cause__ = OSError(errno.ECONNREFUSED, "refused")
    assert redacted_exception(exc) is exc


def test_file_not_found_stays_one_with_its_errno_and_traceback() -> None:
    try:
        raise FileNotFoundError(errno.ENOENT, "No such file", S3_V4)
    except FileNotFoundError as caught:
        exc = caught
    copy = redacted_exception(exc)
    assert type(copy) is FileNotFoundError and isinstance(copy, FileNotFoundError)
    assert copy.errno == errno.ENOENT and copy.__traceback__ is exc.__traceback__
    assert SIGNATURE not in str(copy) and "X-Amz-Signature=REDACTED" in str(copy)
    assert str(exc).count(SIGNATURE) == 1  # the original is not changed


def test_storage_error_subclass_keeps_its_type_and_attributes() -> None:
    exc = ShardChangedError(f"'{S3_V4}' changed", path=S3_V4, opened="etag a", found=None)
    copy = redacted_exception(exc)
    assert isinstance(copy, ShardChangedError)
    assert SIGNATURE not in str(copy) and SIGNATURE not in copy.path
    assert copy.opened == "etag a" and copy.found is None


class _ResponseError(Exception):
    """Like aiohttp's ClientResponseError: its text is built from attributes, not args."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__()
        self.url_parts = (url,)
        self.status = status

    def __str__(self) -> str:
        return f"{self.status}, url='{self.url_parts[0]}'"


def test_an_exception_that_cannot_be_copied_clean_becomes_a_redacted_error() -> None:
    inner = _ResponseError(S3_V4, 503)
    outer = OSError(errno.EIO, f"read failed: {S3_V4}")
    outer.__cause__ = inner
    copy = redacted_exception(outer)
    assert isinstance(copy, OSError) and copy.errno == errno.EIO
    cause = copy.__cause__
    assert isinstance(cause, RedactedError) and cause.type_name == "_ResponseError"
    assert SIGNATURE not in str(cause) and "examplebucket.s3.amazonaws.com/shards" in str(cause)
    assert is_transient(copy)  # the status (503) is kept


def test_messages_built_from_url_and_exception_are_redacted() -> None:
    exc = _ResponseError(S3_V4, 500)
    for error in (storage_error(S3_V4, exc, action="read"),
                  storage_error(S3_V4, exc, action="read", attempts=3, elapsed_seconds=1.0),
                  storage_error(S3_V4, PermissionError(S3_V4), action="read"),
                  storage_error(S3_V4, FileNotFoundError(S3_V4), action="read")):
        assert not any(secret in str(error) for secret in SECRETS), str(error)
        assert "examplebucket.s3.amazonaws.com/shards/train-00000.shard" in str(error)
    assert SIGNATURE not in describe(exc)


def test_changed_shard_message_is_redacted_and_keeps_the_url_given() -> None:
    error = changed_error(S3_V4, "etag \"a\"", "etag \"b\"")
    assert SIGNATURE not in str(error) and "X-Amz-Signature=REDACTED" in str(error)
    assert error.path == S3_V4  # to open it again


# -- what a user sees: a presigned URL refused or failing on a real server -------------------


class _Refusing(http.server.ThreadingHTTPServer):
    status = 403


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Refusing

    def _answer(self) -> None:
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture()
def refusing_server() -> Iterator[_Refusing]:
    server = _Refusing(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(params=["fsspec", "obstore registered"])
def road(request: pytest.FixtureRequest) -> Iterator[str]:
    """The default road, and the one with obstore registered for http:// (obstore leaves a
    URL with a query to fsspec: the secrets must be redacted either way)."""
    if request.param == "fsspec":
        yield request.param
        return
    pytest.importorskip("obstore")
    from shardfeed.storage.obstore_backend import use_obstore

    if "http" in registered():
        pytest.skip(f"http:// is already read by {registered()['http']}; not replaced here")
    use_obstore(["http"])
    assert registered()["http"] == "obstore"
    try:
        yield request.param
    finally:
        unregister_backend(["http"])


def _presigned(port: int) -> str:
    return (
        f"http://127.0.0.1:{port}/bucket/obj.bin?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        f"&X-Amz-Credential={ACCESS_KEY}/20260101/us-east-1/s3/aws4_request"
        f"&X-Amz-Date=20260101T000000Z&X-Amz-SignedHeaders=host"
        f"&X-Amz-Signature={SIGNATURE}&X-Amz-Security-Token={TOKEN}"
    )


def _shown(error: StorageError) -> list[str]:
    """Every text of the error a user may see: str, repr, the chain's, the traceback."""
    texts = ["".join(traceback.format_exception(error))]
    current: BaseException | None = error
    while current is not None:
        texts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return texts


def _read_through(how: str, url: str) -> None:
    if how == "open_source":
        source = open_source(url, retries=1, backoff_seconds=0.01, deadline_seconds=5)
        source.read(0, 10)
    else:
        with retry_policy(RetryPolicy(retries=1, backoff_seconds=0.01, deadline_seconds=5)):
            read_bytes(url)


@pytest.mark.parametrize("status", [403, 500])
@pytest.mark.parametrize("how", ["open_source", "read_bytes"])
def test_a_failed_presigned_read_shows_no_secret(
        refusing_server: _Refusing, road: str, status: int, how: str,
        caplog: pytest.LogCaptureFixture) -> None:
    refusing_server.status = status
    port = refusing_server.server_address[1]
    url = _presigned(port)
    caplog.set_level(logging.DEBUG, logger="shardfeed")
    with pytest.raises(StorageError) as info:
        _read_through(how, url)
    texts = _shown(info.value)
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("shardfeed")]
    for text in [*texts, *logged, caplog.text]:
        assert not any(secret in text for secret in SECRETS), text
    assert f"127.0.0.1:{port}/bucket/obj.bin?" in str(info.value)
    assert "X-Amz-Signature=REDACTED" in str(info.value)
    assert info.value.__cause__ is not None
    assert f"127.0.0.1:{port}/bucket/obj.bin" in str(info.value.__cause__)
    if status == 500:  # retried once: the retry is logged, redacted
        assert len(logged) == 1 and "X-Amz-Security-Token=REDACTED" in logged[0]
        assert "after 2 attempts" in str(info.value)
