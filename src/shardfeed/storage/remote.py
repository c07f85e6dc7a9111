"""Object storage through fsspec: byte ranges, range coalescing, retries, storage options.

Any fsspec URL works (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``memory://``); the
protocol's package (``s3fs``, ``gcsfs``, ...) must be installed.

Storage options (endpoint, credentials, anonymous access) reach the filesystem in three ways,
later ones overriding earlier ones:

1. fsspec's own configuration: environment variables ``FSSPEC_<PROTOCOL>_<OPTION>`` read when
   fsspec is first imported, e.g. ``FSSPEC_S3_ENDPOINT_URL=http://127.0.0.1:9000``, or a JSON
   file in ``~/.config/fsspec/``. For S3, botocore also honours ``AWS_ENDPOINT_URL`` (and
   ``AWS_ENDPOINT_URL_S3``), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``.
2. :func:`set_storage_options` — a process-wide registry keyed by URL prefix::

       set_storage_options("s3://my-bucket/", endpoint_url="http://minio:9000", anon=False)

3. ``storage_options={...}`` given to :class:`RemoteSource` or a ``storage.files`` function.

Retries: :class:`RemoteSource` retries transient failures (refused or dropped connections,
timeouts, HTTP 5xx/429) with exponential backoff and jitter, on top of whatever retries the
filesystem package does itself (s3fs and botocore retry some errors too; for a strict time
bound set ``config_kwargs={"retries": {"total_max_attempts": 1}}`` and ``retries=1`` in the
s3fs options). Permanent failures (no such bucket or key, access denied) raise
:class:`~shardfeed.errors.StorageError` at once, naming the URL.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from shardfeed.errors import StorageError
from shardfeed.storage.cache import ByteCache

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_COALESCE_GAP_BYTES = 256 * 1024
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024

# ---------------------------------------------------------------------------------------------
# Storage options registry
# ---------------------------------------------------------------------------------------------

_OPTIONS: dict[str, dict[str, Any]] = {}
_OPTIONS_LOCK = threading.Lock()


def set_storage_options(prefix: str, /, **options: Any) -> None:
    """Use these fsspec ``options`` for every URL that starts with ``prefix``.

    ``prefix`` is a protocol (``"s3://"``) or a longer URL prefix (``"s3://bucket/"``); when
    several match, longer prefixes override shorter ones option by option. Calling again with
    the same prefix replaces its options; no options removes the entry.
    """
    if not isinstance(prefix, str) or "://" not in prefix:
        raise ValueError(
            f"prefix must be a URL prefix such as 's3://' or 's3://bucket/', got {prefix!r}"
        )
    with _OPTIONS_LOCK:
        if options:
            _OPTIONS[prefix] = dict(options)
        else:
            _OPTIONS.pop(prefix, None)


def clear_storage_options() -> None:
    """Forget every option set with :func:`set_storage_options`."""
    with _OPTIONS_LOCK:
        _OPTIONS.clear()


def storage_options_for(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The options for ``url``: registered prefixes (shortest first), then ``storage_options``."""
    merged: dict[str, Any] = {}
    with _OPTIONS_LOCK:
        matches = sorted((p for p in _OPTIONS if url.startswith(p)), key=len)
        for prefix in matches:
            merged.update(_OPTIONS[prefix])
    if storage_options:
        merged.update(storage_options)
    return merged


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """``(fsspec filesystem, path within it)`` for ``url``, with the options for that URL.

    fsspec caches filesystem instances, so calling this per file is cheap.
    """
    import fsspec.core

    options = storage_options_for(url, storage_options)
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise StorageError(
            f"cannot open '{url}': the package for this protocol is missing ({exc}); install "
            "it, e.g. pip install 'shardfeed[s3]' for s3:// or gcsfs for gs://"
        ) from exc
    except ValueError as exc:
        raise StorageError(f"cannot open '{url}': {exc}") from exc
    return fs, str(path)


# ---------------------------------------------------------------------------------------------
# Error classification and retries
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Range coalescing
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """One request ``[start, end)`` that serves the asked ranges at positions ``members``."""

    start: int
    end: int
    members: tuple[int, ...]


def coalesce_ranges(
    ranges: Sequence[tuple[int, int]], *, gap_bytes: int, max_request_bytes: int
) -> list[RangeRequest]:
    """Group ``(offset, length)`` ranges into few requests.

    Ranges are taken in offset order; a range joins the current request when the hole
    between them is at most ``gap_bytes`` (overlaps count as no hole) and the request would
    stay within ``max_request_bytes``; a single range longer than that is one request alone.
    Zero-length ranges need no bytes and belong to no request. Every other asked range is a
    member of exactly one request that covers it.
    """
    order = sorted(
        (i for i in range(len(ranges)) if ranges[i][1] > 0), key=lambda i: ranges[i][0]
    )
    requests: list[RangeRequest] = []
    start = end = 0
    members: list[int] = []
    for i in order:
        offset, length = ranges[i]
        stop = offset + length
        if members and offset - end <= gap_bytes and max(end, stop) - start <= max_request_bytes:
            end = max(end, stop)
            members.append(i)
            continue
        if members:
            requests.append(RangeRequest(start, end, tuple(members)))
        start, end, members = offset, stop, [i]
    if members:
        requests.append(RangeRequest(start, end, tuple(members)))
    return requests


def _check_range(offset: int, length: int) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, got {offset!r}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be an int >= 0, got {length!r}")


# ---------------------------------------------------------------------------------------------
# The byte source
# ---------------------------------------------------------------------------------------------


class RemoteSource:
    """Random access to one object of any fsspec filesystem, by byte range. Thread-safe.

    ``read(offset, length)`` is one ranged GET. ``read_ranges`` sorts the ranges, merges
    neighbours whose hole is at most ``coalesce_gap_bytes`` into one request (up to
    ``max_request_bytes``), and runs up to ``max_concurrency`` requests at once on the
    source's thread pool. ``size()`` is one HEAD, remembered. With a ``cache``, an object no
    larger than ``cache.max_item_bytes`` is fetched whole once and served from memory.

    Determinism: the bytes returned do not depend on coalescing, concurrency or retries.
    State: none beyond the remembered size. Memory: the requests in flight (each at most
    ``max_request_bytes``, or one asked range if longer), ``max_concurrency`` threads, and
    the cache if given.
    """

    def __init__(
        self,
        url: str,
        *,
        max_concurrency: int = 16,
        coalesce_gap_bytes: int = DEFAULT_COALESCE_GAP_BYTES,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        retries: int = 5,
        backoff_seconds: float = 0.1,
        max_backoff_seconds: float = 10.0,
        storage_options: Mapping[str, Any] | None = None,
        cache: ByteCache | None = None,
    ) -> None:
        if not isinstance(url, str) or "://" not in url:
            raise ValueError(f"url must be an fsspec URL such as 's3://bucket/key', got {url!r}")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or (
            max_concurrency < 1
        ):
            raise ValueError(f"max_concurrency must be an int >= 1, got {max_concurrency!r}")
        if isinstance(coalesce_gap_bytes, bool) or not isinstance(coalesce_gap_bytes, int) or (
            coalesce_gap_bytes < -1
        ):
            raise ValueError(
                f"coalesce_gap_bytes must be an int >= 0 (or -1 to merge only overlapping "
                f"ranges), got {coalesce_gap_bytes!r}"
            )
        if isinstance(max_request_bytes, bool) or not isinstance(max_request_bytes, int) or (
            max_request_bytes < 1
        ):
            raise ValueError(f"max_request_bytes must be an int >= 1, got {max_request_bytes!r}")
        if cache is not None and not isinstance(cache, ByteCache):
            raise TypeError(f"cache must be a ByteCache or None, got {type(cache).__name__}")
        self.url = url
        self.max_concurrency = max_concurrency
        self.coalesce_gap_bytes = coalesce_gap_bytes
        self.max_request_bytes = max_request_bytes
        self.policy = RetryPolicy(
            retries=retries, backoff_seconds=backoff_seconds, max_backoff_seconds=max_backoff_seconds
        )
        self.cache = cache
        self._fs, self._path = filesystem(url, storage_options)
        self._retrier = Retrier(self.policy, key=url)
        self._size: int | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._lock = threading.Lock()
        self._closed = False
        self._requests = 0
        self._bytes_fetched = 0

    # -- statistics -------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters since opening: ``requests`` (GETs that returned), ``bytes_fetched``,
        ``retries`` (transient failures retried)."""
        with self._lock:
            return {
                "requests": self._requests,
                "bytes_fetched": self._bytes_fetched,
                "retries": self._retrier.retries_done,
            }

    # -- ByteSource -------------------------------------------------------------------------

    def size(self) -> int:
        if self._size is None:
            self._check_open()
            info_size = self._retrier.call(
                lambda: self._fs.size(self._path), url=self.url, action="get the size of"
            )
            if info_size is None:
                raise StorageError(
                    f"cannot get the size of '{self.url}': the storage does not report one "
                    "(is it a folder?); give the URL of one object"
                )
            self._size = int(info_size)
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        _check_range(offset, length)
        if length == 0:
            return b""
        whole = self._cached_whole()
        if whole is not None:
            return whole[offset : offset + length]
        return self._fetch(offset, offset + length)

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        for offset, length in ranges:
            _check_range(offset, length)
        out: list[bytes] = [b""] * len(ranges)
        if not ranges:
            return out
        whole = self._cached_whole()
        if whole is not None:
            return [whole[offset : offset + length] for offset, length in ranges]
        plan = coalesce_ranges(
            ranges, gap_bytes=self.coalesce_gap_bytes, max_request_bytes=self.max_request_bytes
        )
        if len(plan) == 1:
            blobs = [self._fetch(plan[0].start, plan[0].end)]
        else:
            pool = self._executor()
            blobs = list(pool.map(lambda r: self._fetch(r.start, r.end), plan))
        for request, blob in zip(plan, blobs):
            for i in request.members:
                offset, length = ranges[i]
                lo = offset - request.start
                out[i] = blob[lo : lo + length]
        return out

    def close(self) -> None:
        """Stop the thread pool; idempotent. Reads after close raise StorageError."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteSource({self.url!r})"

    # -- internals --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"'{self.url}' was closed; open it again with open_source(url)")

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise StorageError(
                    f"'{self.url}' was closed; open it again with open_source(url)"
                )
            if self._pool is not None and self._pool_pid != os.getpid():
                # Forked child: the parent's pool threads do not exist here.
                self._pool = None
            if self._pool is None:
                self._pool_pid = os.getpid()
                self._pool = ThreadPoolExecutor(
                    max_workers=self.max_concurrency, thread_name_prefix="shardfeed-remote"
                )
            return self._pool

    def _cached_whole(self) -> bytes | None:
        cache = self.cache
        if cache is None:
            return None
        data = cache.get(self.url)
        if data is not None:
            return data
        if self.size() > cache.max_item_bytes:
            return None
        data = self._fetch(0, self.size()) if self.size() else b""
        cache.put(self.url, data)
        return data

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``, fewer only at end of object."""
        self._check_open()

        def get() -> bytes:
            try:
                return bytes(self._fs.cat_file(self._path, start=start, end=end))
            except OSError as exc:
                # A range that starts at or past the end is an error for S3 (416); the
                # ByteSource contract says: an empty read.
                if exc.errno == errno.EINVAL and start >= self.size():
                    return b""
                raise

        data = self._retrier.call(get, url=self.url, action=f"read bytes {start}..{end} of")
        with self._lock:
            self._requests += 1
            self._bytes_fetched += len(data)
        return data
