"""Retries for object storage: error classification, backoff policy, and StorageError messages.

Transient failures (refused or dropped connections, timeouts, HTTP 5xx/429) are retried with
exponential backoff and jitter, on top of whatever retries the filesystem package does itself
(s3fs and botocore retry some errors too; for a strict time bound set
``config_kwargs={"retries": {"total_max_attempts": 1}}`` and ``retries=1`` in the s3fs
options). Permanent failures (no such bucket or key, access denied) raise
:class:`~shardfeed.errors.StorageError` at once, naming the URL.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from shardfeed.errors import StorageError

logger = logging.getLogger(__name__)

T = TypeVar("T")

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


def storage_error(url: str, exc: BaseException, *, action: str, attempts: int = 1) -> StorageError:
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
        text = (
            f"cannot {action} '{url}' after {attempts} attempts: {type(exc).__name__}: "
            f"{detail}; check that the storage endpoint is reachable (endpoint_url, "
            "AWS_ENDPOINT_URL or FSSPEC_S3_ENDPOINT_URL) and retry"
        )
    else:
        text = f"cannot {action} '{url}': {type(exc).__name__}: {detail}"
    return StorageError(text)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How transient failures are retried: ``retries`` more attempts after the first one.

    The wait before retry i (0-based) is ``min(max_backoff_seconds, backoff_seconds * 2**i)``
    times a jitter factor in [0.5, 1), drawn from a private generator keyed by the URL.
    Worst case time spent waiting: the sum of those caps.
    """

    retries: int = 5
    backoff_seconds: float = 0.1
    max_backoff_seconds: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {self.retries!r}")
        if not self.backoff_seconds >= 0:
            raise ValueError(f"backoff_seconds must be >= 0, got {self.backoff_seconds!r}")
        if not self.max_backoff_seconds >= self.backoff_seconds:
            raise ValueError(
                f"max_backoff_seconds must be >= backoff_seconds ({self.backoff_seconds}), "
                f"got {self.max_backoff_seconds!r}"
            )

    def delay(self, attempt: int, jitter: float) -> float:
        """Seconds to wait before retry ``attempt`` (0-based), with ``jitter`` in [0, 1)."""
        cap = min(self.max_backoff_seconds, self.backoff_seconds * 2.0**attempt)
        return cap * (0.5 + 0.5 * jitter)

    def worst_case_wait_seconds(self) -> float:
        """The most time all waits of one call can add up to."""
        return sum(
            min(self.max_backoff_seconds, self.backoff_seconds * 2.0**i)
            for i in range(self.retries)
        )


class Retrier:
    """Runs a call under a :class:`RetryPolicy`; jitter from a private generator keyed by URL."""

    def __init__(self, policy: RetryPolicy, *, key: str) -> None:
        self.policy = policy
        self._rng = random.Random(zlib.crc32(key.encode("utf-8", "surrogatepass")))
        self._lock = threading.Lock()
        self.retries_done = 0

    def call(self, fn: Callable[[], T], *, url: str, action: str) -> T:
        """``fn()``; transient failures are retried, others raise StorageError naming ``url``."""
        attempt = 0
        while True:
            try:
                return fn()
            except StorageError:
                raise
            except Exception as exc:
                if not is_transient(exc):
                    raise storage_error(url, exc, action=action) from exc
                if attempt >= self.policy.retries:
                    raise storage_error(url, exc, action=action, attempts=attempt + 1) from exc
                with self._lock:
                    jitter = self._rng.random()
                    self.retries_done += 1
                wait = self.policy.delay(attempt, jitter)
                logger.debug(
                    "%s '%s' failed (%s: %s); retry %d/%d in %.2f s",
                    action, url, type(exc).__name__, exc, attempt + 1, self.policy.retries, wait,
                )
                time.sleep(wait)
                attempt += 1


__all__ = ["Retrier", "RetryPolicy", "is_transient", "storage_error"]
