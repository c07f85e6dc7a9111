"""What went wrong with a storage call: transient or permanent, and the StorageError that says so.

Transient failures (refused or dropped connections, timeouts, HTTP 5xx and 429) are worth
retrying; everything else is permanent. Messages name the URL and what was asked, and say
what to do.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping

from shardfeed.errors import StorageError

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
_transient_types: tuple[type[BaseException], ...] | None = None


def _optional_transient_types() -> tuple[type[BaseException], ...]:
    """Network error types of the optional client packages, imported only if installed."""
    global _transient_types
    if _transient_types is None:
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
        _transient_types = tuple(found)
    return _transient_types


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
            return status >= 500 or status == 429
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


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, for messages."""
    return f"{type(exc).__name__}: {str(exc) or type(exc).__name__}"


def storage_error(url: str, exc: BaseException, *, action: str, attempts: int = 1,
                  elapsed_seconds: float | None = None) -> StorageError:
    """A StorageError for ``exc`` that names ``url`` and says what to do."""
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
    return StorageError(text)


def deadline_error(url: str, *, action: str, deadline_seconds: float, attempts: int,
                   elapsed_seconds: float, last_error: BaseException | None,
                   still_waiting: bool, unfinished: int = 1) -> StorageError:
    """The StorageError of a call that did not succeed within its deadline."""
    tries = f"{attempts} attempt{'s' if attempts != 1 else ''} in {elapsed_seconds:.1f} s"
    if still_waiting:
        tries += ", the last one still unanswered"
    if last_error is not None:
        tries += f"; last error: {describe(last_error)}"
    more = f" (and {unfinished - 1} more request{'s' if unfinished > 2 else ''})" \
        if unfinished > 1 else ""
    return StorageError(
        f"cannot {action} '{url}'{more}: no success within deadline_seconds="
        f"{deadline_seconds:g} ({tries}); {_what_to_do(last_error)}, or give a larger "
        "deadline_seconds"
    )


__all__ = ["deadline_error", "describe", "is_transient", "storage_error"]
