"""Object storage through fsspec: byte ranges and range coalescing.

Any fsspec URL works (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``memory://``); the
protocol's package (``s3fs``, ``gcsfs``, ...) must be installed.

Storage options (endpoint, credentials, anonymous access) come from fsspec's configuration,
:func:`~shardfeed.storage.options.set_storage_options`, or ``storage_options={...}`` given to
:class:`RemoteSource` (see :mod:`shardfeed.storage.options`). Transient failures are retried
with backoff; permanent ones raise :class:`~shardfeed.errors.StorageError` at once, naming the
URL (see :mod:`shardfeed.storage.retry`).

The option registry and the retry helpers are re-exported here, so
``from shardfeed.storage.remote import set_storage_options, Retrier`` keeps working.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardfeed.errors import StorageError
from shardfeed.storage.cache import ByteCache
from shardfeed.storage.options import (
    clear_storage_options,
    filesystem,
    set_storage_options,
    storage_options_for,
)
from shardfeed.storage.retry import Retrier, RetryPolicy, is_transient, storage_error

if TYPE_CHECKING:
    from typing_extensions import Self

DEFAULT_COALESCE_GAP_BYTES = 256 * 1024
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024

__all__ = [
    "DEFAULT_COALESCE_GAP_BYTES",
    "DEFAULT_MAX_REQUEST_BYTES",
    "RangeRequest",
    "RemoteOptions",
    "RemoteSource",
    "Retrier",
    "RetryPolicy",
    "clear_storage_options",
    "coalesce_ranges",
    "filesystem",
    "is_transient",
    "set_storage_options",
    "storage_error",
    "storage_options_for",
]

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
# Options
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RemoteOptions:
    """How a :class:`RemoteSource` reads: the keyword options of ``open_source(url, ...)``.

    ``max_concurrency``: requests in flight for one ``read_ranges`` call (and, in a
    :class:`~shardfeed.dataset.Dataset`, shards read at once by one ``read_many``).
    ``coalesce_gap_bytes``: ranges whose hole is at most this many bytes share one request
    (-1: only overlapping ranges). ``max_request_bytes``: merged requests stop growing here.
    ``retries``, ``backoff_seconds``, ``max_backoff_seconds``: see :class:`RetryPolicy`.
    ``storage_options``: fsspec options (endpoint, credentials). ``cache``: whole small
    objects kept in memory.

    The filesystem package may bound requests in flight too: s3fs (botocore) keeps 10
    connections per filesystem unless told otherwise, so for more than about 10 requests at
    once pass ``storage_options={"config_kwargs": {"max_pool_connections": 64}}``.
    """

    max_concurrency: int = 16
    coalesce_gap_bytes: int = DEFAULT_COALESCE_GAP_BYTES
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    retries: int = 5
    backoff_seconds: float = 0.1
    max_backoff_seconds: float = 10.0
    storage_options: Mapping[str, Any] | None = None
    cache: ByteCache | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.max_concurrency) or self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be an int >= 1, got {self.max_concurrency!r}")
        if not _is_int(self.coalesce_gap_bytes) or self.coalesce_gap_bytes < -1:
            raise ValueError(
                f"coalesce_gap_bytes must be an int >= 0 (or -1 to merge only overlapping "
                f"ranges), got {self.coalesce_gap_bytes!r}"
            )
        if not _is_int(self.max_request_bytes) or self.max_request_bytes < 1:
            raise ValueError(
                f"max_request_bytes must be an int >= 1, got {self.max_request_bytes!r}"
            )
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise TypeError(
                "storage_options must be a mapping of fsspec options (e.g. {'anon': True}) "
                f"or None, got {type(self.storage_options).__name__}"
            )
        if self.cache is not None and not isinstance(self.cache, ByteCache):
            raise TypeError(f"cache must be a ByteCache or None, got {type(self.cache).__name__}")
        self.policy()  # checks retries and backoff

    def policy(self) -> RetryPolicy:
        """The retry policy these options describe."""
        return RetryPolicy(retries=self.retries, backoff_seconds=self.backoff_seconds,
                           max_backoff_seconds=self.max_backoff_seconds)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any], /, *, what: str) -> RemoteOptions:
        """Options from a ``{name: value}`` mapping; an unknown name is a TypeError listing
        the known ones (``what`` names the argument in messages)."""
        if not isinstance(options, Mapping):
            raise TypeError(
                f"{what} must be a mapping such as {{'max_concurrency': 32}}, got "
                f"{type(options).__name__}"
            )
        known = cls.__dataclass_fields__
        unknown = sorted(str(k) for k in options if k not in known)
        if unknown:
            raise TypeError(
                f"{what} has unknown option(s) {unknown}; the options are {sorted(known)}"
            )
        return cls(**options)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
        options = RemoteOptions(
            max_concurrency=max_concurrency, coalesce_gap_bytes=coalesce_gap_bytes,
            max_request_bytes=max_request_bytes, retries=retries,
            backoff_seconds=backoff_seconds, max_backoff_seconds=max_backoff_seconds,
            storage_options=storage_options, cache=cache,
        )
        self.url = url
        self.options = options
        self.max_concurrency = max_concurrency
        self.coalesce_gap_bytes = coalesce_gap_bytes
        self.max_request_bytes = max_request_bytes
        self.policy = options.policy()
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
