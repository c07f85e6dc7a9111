"""What went wrong with a storage call: transient or permanent, and the StorageError that says so.

Transient failures (refused or dropped connections, timeouts, HTTP 5xx and 429) are worth
retrying; everything else is permanent. Messages name the URL and what was asked, and say
what to do.

Secrets carried in a URL (the signature and credentials of a presigned S3, GCS or Azure SAS
URL, a token, a ``user:password@``) never reach a message, a log line or an exception chain
raised here: :func:`redact` replaces their values with ``REDACTED``, keeping the parameter
names, the host and the path, and :func:`redacted_exception` gives the cause to chain.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Mapping
from typing import Any

from shardfeed.errors import StorageError
from shardfeed.storage.process_state import PROCESS

_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.EAGAIN,
        errno.EBUSY,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
        getattr(errno, "EREMOTEIO", errno.EIO),
    }
)
_PERMANENT_OS_ERRORS = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)


def _optional_transient_types() -> tuple[type[BaseException], ...]:
    """Network error types of the optional client packages, imported only if installed
    (looked up once a process)."""
    if PROCESS.transient_types is None:
        found: list[type[BaseException]] = [ConnectionError, TimeoutError]
        try:
            import botocore.exceptions as boto

            found += [boto.ConnectionError, boto.HTTPClientError, boto.IncompleteReadError]
        except ImportError:
            pass
        try:
            import aiohttp

            found += [aiohttp.ClientConnectionError, aiohttp.ClientPayloadError]
        except ImportError:
            pass
        PROCESS.transient_types = tuple(found)
    return PROCESS.transient_types


def _http_status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        meta = response.get("ResponseMetadata")
        if isinstance(meta, Mapping) and isinstance(meta.get("HTTPStatusCode"), int):
            return int(meta["HTTPStatusCode"])
    return None


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying: connection refused/reset, timeouts, HTTP 5xx and 429."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 8:
        chain.append(current)
        current = current.__cause__
    for item in chain:
        status = _http_status(item)
        if status is not None:
            # 501 and 505: the server does not do what was asked; it will not later either
            return (status >= 500 and status not in (501, 505)) or status == 429
    if isinstance(exc, _PERMANENT_OS_ERRORS):
        return False
    if isinstance(exc, _optional_transient_types()):
        return True
    if isinstance(exc, OSError):
        return exc.errno in _TRANSIENT_ERRNOS
    return False


_REACH_HINT = (
    "check that the storage endpoint is reachable and answers (endpoint_url, AWS_ENDPOINT_URL "
    "or FSSPEC_S3_ENDPOINT_URL)"
)


def _what_to_do(exc: BaseException | None) -> str:
    """The exception's own ``advice`` (e.g. a server's short answer: not the endpoint's
    reach), else: check the endpoint."""
    advice = getattr(exc, "advice", None)
    return advice if isinstance(advice, str) else _REACH_HINT


REDACTED = "REDACTED"
"""What stands in a message for the value of a secret."""

SECRET_QUERY_PARAMETERS = frozenset(
    {
        # AWS SigV4 / SigV2 presigned URLs (X-Amz-Credential holds the access key id)
        "x-amz-signature", "x-amz-credential", "x-amz-security-token", "signature",
        # GCS V4 signed URLs
        "x-goog-signature", "x-goog-credential", "x-goog-security-token",
        # Azure SAS
        "sig",
        # tokens and keys of HTTP APIs (GCS JSON API ?key=, OAuth ?access_token=)
        "token", "access_token", "refresh_token", "id_token", "sessiontoken",
        "security_token", "key", "api_key", "apikey", "api-key", "x-api-key",
        "password", "passwd", "secret", "client_secret",
    }
)
"""Query parameters (lower case) whose values :func:`redact` hides. The others stay: an
Azure SAS's ``sv``/``sp``/``se``, ``X-Amz-Date``, ``Expires``, ``AWSAccessKeyId`` and
``GoogleAccessId`` tell which URL it was and when it expires, and grant nothing alone."""

# A secret parameter after "?", "&" or ";" (also "&amp;" in an XML answer); its value ends
# where a URL ends in text: at the next parameter, a fragment, a blank, a quote, or the
# backslash of an escaped quote in a repr.
_SECRET_PARAMETER = re.compile(
    r"([?&;](?:" + "|".join(re.escape(name) for name in sorted(SECRET_QUERY_PARAMETERS))
    + r")=)[^&;#\s'\"<>\\]+",
    re.IGNORECASE,
)
# user[:password]@ in a URL's authority (up to its last "@": a password may hold one).
_USERINFO = re.compile(r"\b([a-z][a-z0-9+.\-]*://)[^/?#\s'\"<>\\]+@", re.IGNORECASE)
_WITHHELD = "(message withheld: it could not be checked for secrets)"


def redact(text: str) -> str:
    """``text`` with the secrets of every URL in it replaced by ``REDACTED``: the values of
    the query parameters of :data:`SECRET_QUERY_PARAMETERS` (names compared without case)
    and a ``user:password@``. Parameter names, host and path stay, so the message still says
    which URL it was.

    Cheap on text without ``?``, ``&`` or ``@`` (returned as is); never raises.

    >>> redact("https://b.s3.amazonaws.com/k?X-Amz-Date=20260101T000000Z&X-Amz-Signature=ab12")
    'https://b.s3.amazonaws.com/k?X-Amz-Date=20260101T000000Z&X-Amz-Signature=REDACTED'
    """
    try:
        if "?" not in text and "&" not in text and "@" not in text:
            return text
        text = _SECRET_PARAMETER.sub(r"\1" + REDACTED, text)
        if "@" in text:
            text = _USERINFO.sub(r"\1" + REDACTED + "@", text)
        return text
    except Exception:  # noqa: BLE001 - a message must never fail, nor leak
        return _WITHHELD


class RedactedError(StorageError):
    """Stands in a chain of causes for an exception whose text held a secret and that could
    not be copied with its secrets redacted: its type's name and its redacted text, its
    traceback, and its ``status`` and ``advice`` where it had them."""

    def __init__(self, message: str, *, type_name: str, status: int | None = None,
                 advice: str | None = None) -> None:
        super().__init__(message)
        self.type_name = type_name
        if status is not None:
            self.status = status
        if advice is not None:
            self.advice = advice


def _clean(exc: BaseException) -> bool:
    try:
        notes = getattr(exc, "__notes__", None) or []
        texts = [str(exc), repr(exc), *(note for note in notes if isinstance(note, str))]
        return all(redact(text) == text for text in texts)
    except Exception:  # noqa: BLE001 - an exception whose str fails is judged unclean
        return False


def _redacted_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [redact(item) for item in value]  # __notes__
    return value


def _same_type_copy(exc: BaseException) -> BaseException | None:
    """A copy of ``exc`` (without its chain) of the same type, its string arguments and
    attributes redacted; ``__init__`` is not run again, as in unpickling. None where that
    copy still shows a secret or cannot be made."""
    try:
        kind = type(exc)
        args = tuple(_redacted_value(arg) for arg in exc.args)
        copy = kind.__new__(kind, *args)
        copy.args = args
        if isinstance(exc, OSError) and isinstance(copy, OSError):
            # set only those set: an OSError's str tells "unset" from None
            for name in ("errno", "strerror", "filename", "filename2"):
                value = getattr(exc, name)
                if value is not None:
                    setattr(copy, name, _redacted_value(value))
        state = getattr(exc, "__dict__", None)
        if state:
            copy.__dict__.update({name: _redacted_value(v) for name, v in state.items()})
    except Exception:  # noqa: BLE001 - any type may refuse; the caller falls back
        return None
    return copy if _clean(copy) else None


def _copy_redacted(exc: BaseException) -> BaseException:
    """:func:`_same_type_copy`, else a :class:`RedactedError` standing in for ``exc``."""
    copy = _same_type_copy(exc)
    if copy is not None:
        return copy
    try:
        text = redact(str(exc))
    except Exception:  # noqa: BLE001 - its str itself failed
        text = _WITHHELD
    advice = getattr(exc, "advice", None)
    return RedactedError(
        f"{type(exc).__module__}.{type(exc).__qualname__}: {text}", type_name=type(exc).__name__,
        status=_http_status(exc), advice=redact(advice) if isinstance(advice, str) else None,
    )


def redacted_exception(exc: BaseException) -> BaseException:
    """``exc`` itself when neither it nor its causes and contexts show a secret (see
    :func:`redact`) in their text, else a copy of the chain with the secrets redacted: each
    exception of the same type where it can be copied (a ``FileNotFoundError`` stays one),
    else a :class:`RedactedError`; tracebacks are kept. For ``raise ... from``; never raises.
    """
    return _redacted_chain(exc, depth=0)


_MAX_CHAIN = 16


def _chain_clean(exc: BaseException) -> bool:
    seen: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo:
        item = todo.pop()
        if any(item is known for known in seen):
            continue
        if len(seen) >= _MAX_CHAIN or not _clean(item):
            return False
        seen.append(item)
        todo += [link for link in (item.__cause__, item.__context__) if link is not None]
    return True


def _redacted_chain(exc: BaseException, *, depth: int) -> BaseException:
    if _chain_clean(exc):
        return exc
    copy = _copy_redacted(exc)
    if depth >= _MAX_CHAIN:
        return copy  # what lies deeper is dropped, not shown
    cause, context = exc.__cause__, exc.__context__
    copy.__cause__ = None if cause is None else _redacted_chain(cause, depth=depth + 1)
    copy.__context__ = (
        None if context is None
        else copy.__cause__ if context is cause
        else _redacted_chain(context, depth=depth + 1)
    )
    copy.__suppress_context__ = exc.__suppress_context__
    copy.__traceback__ = exc.__traceback__
    return copy


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, for messages; secrets in URLs redacted."""
    return redact(f"{type(exc).__name__}: {str(exc) or type(exc).__name__}")


def storage_error(url: str, exc: BaseException, *, action: str, attempts: int = 1,
                  elapsed_seconds: float | None = None) -> StorageError:
    """A StorageError for ``exc`` that names ``url`` and says what to do; the secrets of
    URLs in its text are redacted (chain it ``from redacted_exception(exc)``)."""
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        text = (
            f"cannot {action} '{url}': it does not exist (no such bucket, key or file: "
            f"{detail}); check the URL, the bucket name and the endpoint"
        )
    elif isinstance(exc, PermissionError):
        text = (
            f"cannot {action} '{url}': access denied ({detail}); check the credentials "
            "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or storage options key/"
            "secret/anon) and the bucket policy"
        )
    elif attempts > 1:
        spent = "" if elapsed_seconds is None else f" in {elapsed_seconds:.1f} s"
        text = (
            f"cannot {action} '{url}' after {attempts} attempts{spent}: {describe(exc)}; "
            f"{_what_to_do(exc)}, and retry"
        )
    else:
        text = f"cannot {action} '{url}': {describe(exc)}"
        advice = getattr(exc, "advice", None)
        if isinstance(advice, str):
            text += f"; {advice}"
    return StorageError(redact(text))


def deadline_error(url: str, *, action: str, deadline_seconds: float, attempts: int,
                   elapsed_seconds: float, last_error: BaseException | None,
                   still_waiting: bool, unfinished: int = 1) -> StorageError:
    """The StorageError of a call that did not succeed within its deadline; the secrets of
    URLs in its text are redacted."""
    tries = f"{attempts} attempt{'s' if attempts != 1 else ''} in {elapsed_seconds:.1f} s"
    if still_waiting:
        tries += ", the last one still unanswered"
    if last_error is not None:
        tries += f"; last error: {describe(last_error)}"
    more = f" (and {unfinished - 1} more request{'s' if unfinished > 2 else ''})" \
        if unfinished > 1 else ""
    return StorageError(redact(
        f"cannot {action} '{url}'{more}: no success within deadline_seconds="
        f"{deadline_seconds:g} ({tries}); {_what_to_do(last_error)}, or give a larger "
        "deadline_seconds"
    ))


__all__ = [
    "REDACTED",
    "SECRET_QUERY_PARAMETERS",
    "RedactedError",
    "deadline_error",
    "describe",
    "is_transient",
    "redact",
    "redacted_exception",
    "storage_error",
]
