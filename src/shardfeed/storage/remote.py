"""Object storage through fsspec: byte ranges and range coalescing.

Any fsspec URL works (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``memory://``); the
protocol's package (``s3fs``, ``gcsfs``, ...) must be installed. ``s3://``, ``gs://`` and
``az://`` are read by :mod:`~shardfeed.storage.obstore_backend` where it can (see
:mod:`~shardfeed.storage.backends`); this reads them otherwise. Each answer is checked
against the range asked: a short one is retried, a whole object gives the range cut from it,
another length is an error.

Storage options (endpoint, credentials, anonymous access) come from fsspec's configuration,
:func:`~shardfeed.storage.options.set_storage_options`, or ``storage_options={...}`` given to
:class:`RemoteSource` (see :mod:`shardfeed.storage.options`). Transient failures are retried
with backoff; permanent ones raise :class:`~shardfeed.errors.StorageError` at once, naming the
URL (see :mod:`shardfeed.storage.retry`). Every call (``size``, ``read``, ``read_ranges``) has one
deadline, ``deadline_seconds``, covering all its attempts; ``close()`` from another thread, or
Ctrl-C, ends a call at once (see :mod:`shardfeed.storage.inflight`).

The option registry, the range planner and the retry helpers are re-exported here, so
``from shardfeed.storage.remote import set_storage_options, Retrier`` keeps working.
"""

from __future__ import annotations

import datetime
import email.utils
import errno
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardfeed.errors import StorageError
from shardfeed.storage.cache import ByteCache
from shardfeed.storage.inflight import (
    CallGroup,
    is_async,
    start_coroutine,
    start_fs_call,
    start_in_thread,
)
from shardfeed.storage.options import (
    clear_storage_options,
    filesystem,
    set_storage_options,
    storage_options_for,
)
from shardfeed.storage.process_state import PROCESS
from shardfeed.storage.ranges import (
    DEFAULT_COALESCE_GAP_BYTES,
    DEFAULT_MAX_REQUEST_BYTES,
    RangeIgnored,
    RangeRequest,
    ShortAnswer,
    WrongLength,
    check_range,
    checked_answer,
    coalesce_ranges,
    current_read_limit,
    split_answers,
    too_large,
)
from shardfeed.storage.retry import (
    DEFAULT_DEADLINE_SECONDS,
    Job,
    Retrier,
    RetryPolicy,
    is_transient,
    storage_error,
)
from shardfeed.storage.versions import ObjectVersion, changed_error, object_version

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "DEFAULT_COALESCE_GAP_BYTES",
    "DEFAULT_DEADLINE_SECONDS",
    "DEFAULT_MAX_REQUEST_BYTES",
    "RangeRequest",
    "RemoteOptions",
    "RemoteSource",
    "Retrier",
    "RetryPolicy",
    "ShortAnswer",
    "WrongLength",
    "clear_storage_options",
    "coalesce_ranges",
    "filesystem",
    "is_transient",
    "set_storage_options",
    "storage_error",
    "storage_options_for",
]

# ---------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteOptions:
    """How a :class:`RemoteSource` reads: the keyword options of ``open_source(url, ...)``.

    ``max_concurrency``: requests in flight for one ``read_ranges`` call (and, in a
    :class:`~shardfeed.dataset.Dataset`, shards read at once by one ``read_many``).
    ``coalesce_gap_bytes``: ranges whose hole is at most this many bytes share one request
    (-1: only overlapping ranges). ``max_request_bytes``: merged requests stop growing here.
    ``deadline_seconds``: the most one request (a ``read``, each merged request of
    ``read_ranges``, ``size()``) may take, every attempt and every wait between them
    included; past it the read is abandoned with a StorageError that names the URL, the byte
    range, the attempts, the time spent and the last error.
    ``retries`` (None: as many as fit in the deadline), ``backoff_seconds``,
    ``max_backoff_seconds``: see :class:`RetryPolicy`. ``storage_options``: fsspec options
    (endpoint, credentials); the client's own timeouts and retries are fitted inside the
    deadline unless these set them (see :func:`~shardfeed.storage.options.client_options`).
    ``cache``: whole small objects kept in memory.

    The filesystem package may bound requests in flight too: s3fs (botocore) keeps 10
    connections per filesystem unless told otherwise, so for more than about 10 requests at
    once pass ``storage_options={"config_kwargs": {"max_pool_connections": 64}}``.
    """

    max_concurrency: int = 16
    coalesce_gap_bytes: int = DEFAULT_COALESCE_GAP_BYTES
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS
    retries: int | None = None
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
        self.policy()  # checks the deadline, retries and backoff

    def policy(self) -> RetryPolicy:
        """The retry policy (with its deadline) these options describe."""
        return RetryPolicy(retries=self.retries, backoff_seconds=self.backoff_seconds,
                           max_backoff_seconds=self.max_backoff_seconds,
                           deadline_seconds=self.deadline_seconds)

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
    ``max_request_bytes``), and keeps up to ``max_concurrency`` requests in flight at once.
    ``size()`` is one HEAD, remembered. With a ``cache``, an object no larger than
    ``cache.max_item_bytes`` is fetched whole once and served from memory.

    Each request finishes within ``deadline_seconds`` of its first attempt (retries
    included) or the call raises StorageError; the calling thread only waits, so Ctrl-C interrupts it and ``close()``
    from another thread ends it at once (the requests still running are cancelled).

    Once pinned (:meth:`pin`, as a Dataset pins its shards), requests ask for that version
    only where the filesystem lets them: s3fs (``IfMatch`` of the ETag, and the answer's
    ETag compared) and HTTP (an ``If-Match`` header, else ``If-Unmodified-Since``); a
    rewritten object raises :class:`~shardfeed.errors.ShardChangedError`. Other filesystems
    read whatever is there.

    Determinism: the bytes returned do not depend on coalescing, concurrency or retries.
    State: none beyond the remembered size and version. Memory: the requests in flight (each at most
    ``max_request_bytes``, or one asked range if longer) and the cache if given; requests
    run as tasks on fsspec's event loop (async filesystems such as s3fs) or on one daemon
    thread each (other filesystems).
    """

    def __init__(
        self,
        url: str,
        *,
        max_concurrency: int = 16,
        coalesce_gap_bytes: int = DEFAULT_COALESCE_GAP_BYTES,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
        retries: int | None = None,
        backoff_seconds: float = 0.1,
        max_backoff_seconds: float = 10.0,
        storage_options: Mapping[str, Any] | None = None,
        cache: ByteCache | None = None,
    ) -> None:
        if not isinstance(url, str) or "://" not in url:
            raise ValueError(f"url must be an fsspec URL such as 's3://bucket/key', got {url!r}")
        options = RemoteOptions(
            max_concurrency=max_concurrency, coalesce_gap_bytes=coalesce_gap_bytes,
            max_request_bytes=max_request_bytes, deadline_seconds=deadline_seconds,
            retries=retries, backoff_seconds=backoff_seconds,
            max_backoff_seconds=max_backoff_seconds, storage_options=storage_options,
            cache=cache,
        )
        self.url = url
        self.options = options
        self.max_concurrency = max_concurrency
        self.coalesce_gap_bytes = coalesce_gap_bytes
        self.max_request_bytes = max_request_bytes
        self.policy = options.policy()
        self.cache = cache
        self._fs, self._path = self._filesystem()  # again in a forked child (see _client)
        self._retrier = Retrier(self.policy, key=url)
        self._calls = CallGroup()
        self._size: int | None = None
        self._pinned: ObjectVersion | None = None
        self._lock = threading.Lock()
        PROCESS.at_fork(self, RemoteSource._after_fork)
        self._requests = 0
        self._bytes_fetched = 0
        self._seconds = 0.0

    # -- statistics -------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Counters since opening: ``requests`` (GETs that returned), ``bytes_fetched``,
        ``retries`` (transient failures retried), ``seconds`` (the reads' time, summed over
        the threads that waited for them)."""
        with self._lock:
            return {
                "requests": self._requests,
                "bytes_fetched": self._bytes_fetched,
                "retries": self._retrier.retries_done,
                "seconds": self._seconds,
            }

    # -- ByteSource -------------------------------------------------------------------------

    def size(self) -> int:
        if self._size is None:
            fs, path = self._client()
            job: Job[Any] = Job("get the size of", lambda: _start_info(fs, path, "size"))
            info_size = self._retrier.run([job], url=self.url, group=self._calls)[0]
            if info_size is None:
                raise StorageError(
                    f"cannot get the size of '{self.url}': the storage does not report one "
                    "(is it a folder?); give the URL of one object"
                )
            self._size = int(info_size)
        return self._size

    def pin(self, expected: ObjectVersion | None = None) -> ObjectVersion | None:
        """Read only the version there now (one ``info()``, which gives the size too); see
        :class:`~shardfeed.storage.base.PinnedSource`."""
        fs, path = self._client()

        def start() -> Future[Any]:
            fs.invalidate_cache(path)
            return _start_info(fs, path, "info")

        info = self._retrier.run([Job("get the size and version of", start)], url=self.url,
                                 group=self._calls)[0]
        found = object_version(info) if isinstance(info, Mapping) else None
        if expected is not None and found is not None and expected.differs(found):
            raise changed_error(self.url, expected, found)
        size = info.get("size") if isinstance(info, Mapping) else None
        with self._lock:
            if size is not None:
                self._size = int(size)
            self._pinned = found
        return found

    def read(self, offset: int, length: int) -> bytes:
        check_range(offset, length)
        if length == 0:
            return b""
        whole = self._cached_whole()
        if whole is not None:
            return whole[offset : offset + length]
        return self._fetch([(offset, offset + length)])[0]

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        for offset, length in ranges:
            check_range(offset, length)
        if not ranges:
            return []
        whole = self._cached_whole()
        if whole is not None:
            return [whole[offset : offset + length] for offset, length in ranges]
        plan = coalesce_ranges(
            ranges, gap_bytes=self.coalesce_gap_bytes, max_request_bytes=self.max_request_bytes
        )
        return split_answers(ranges, plan, self._fetch([(r.start, r.end) for r in plan]))

    def close(self) -> None:
        """Idempotent. Reads running in other threads stop at once with a StorageError that
        says so (their requests are cancelled); reads after close raise StorageError."""
        self._calls.cancel_all()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteSource({self.url!r})"

    # -- internals --------------------------------------------------------------------------

    def _filesystem(self) -> tuple[Any, str]:
        return filesystem(self.url, self.options.storage_options,
                          deadline_seconds=self.options.deadline_seconds)

    def _client(self) -> tuple[Any, str]:
        """The filesystem and path; a forked child gets its own (fsspec's event loop and
        connections belong to the process that made them)."""
        if self._calls.closed:
            raise StorageError(f"'{self.url}' was closed; open it again with open_source(url)")
        if self._fs is None:
            with self._lock:
                if self._fs is None:
                    self._fs, self._path = self._filesystem()
        return self._fs, self._path

    def _after_fork(self) -> None:
        self._fs = None  # the parent's (see _client)

    def _checked_by(self, fs: Any, pinned: ObjectVersion | None) -> _Pinned | None:
        """How a request of ``fs`` asks for version ``pinned`` (None: it cannot, or there is
        no version to ask for)."""
        if pinned is None or not is_async(fs):
            return None
        if callable(getattr(fs, "_call_s3", None)):
            return _Pinned(self.url, pinned, "s3")
        if type(fs).__name__ == "HTTPFileSystem":
            return _Pinned(self.url, pinned, "http")
        return None

    def _cached_whole(self) -> bytes | None:
        cache = self.cache
        if cache is None:
            return None
        pinned = self._pinned  # a rewritten object is another entry, never the old one
        key = self.url if pinned is None else f"{self.url}#{pinned.text}"
        data = cache.get(key)
        if data is not None:
            return data
        if self.size() > cache.max_item_bytes:
            return None
        data = self._fetch([(0, self.size())])[0] if self.size() else b""
        cache.put(key, data)
        return data

    def _fetch(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """Bytes ``[start, end)`` of each span (fewer only at end of object), up to
        ``max_concurrency`` requests in flight, all within one deadline."""
        fs, path = self._client()
        known_size, pinned = self._size, self._pinned

        def job(start: int, end: int) -> Job[bytes]:
            return Job(f"read bytes {start}..{end} of",
                       lambda: _start_range(fs, path, start, end, known_size,
                                            self._checked_by(fs, pinned)))

        jobs = [job(start, end) for start, end in spans]
        started = time.perf_counter()
        blobs = self._retrier.run(jobs, url=self.url, max_in_flight=self.max_concurrency,
                                  group=self._calls)
        with self._lock:
            self._requests += len(blobs)
            self._bytes_fetched += sum(len(b) for b in blobs)
            self._seconds += time.perf_counter() - started
        return blobs


def _start_info(fs: Any, path: str, what: str) -> Future[Any]:
    """``fs.info(path)`` (``what="info"``) or ``fs.size(path)``; on HTTP one HEAD whose
    status is checked (fsspec takes any answer under 400, a redirect without a Location
    too, as the object's)."""
    if type(fs).__name__ != "HTTPFileSystem" or not is_async(fs):
        return start_fs_call(fs, what, path)

    async def head() -> Any:
        kw = fs.kwargs.copy()
        headers = kw.pop("headers", None) or {}
        session = await fs.set_session()
        async with session.head(fs.encode_url(path), headers=headers, allow_redirects=True,
                                **kw) as answer:
            fs._raise_not_found_for_status(answer, path)
            if answer.status != 200:
                raise WrongLength(f"HTTP {answer.status} answered a HEAD, not the object")
            info = {"name": path, "size": answer.content_length, "type": "file",
                    **{k: answer.headers[k] for k in ("ETag", "Last-Modified")
                       if k in answer.headers}}
        return info["size"] if what == "size" else info

    return start_coroutine(fs, head())


def _start_range(fs: Any, path: str, start: int, end: int, known_size: int | None,
                 pinned: _Pinned | None = None) -> Future[bytes]:
    """One attempt at bytes ``[start, end)`` of ``path`` (of version ``pinned`` only, where
    given), started beside the caller."""
    if known_size is not None and start >= known_size:
        done: Future[bytes] = Future()
        done.set_result(b"")  # past the end: an empty read, no request needed
        return done
    if pinned is not None:
        return start_coroutine(fs, pinned.get_range(fs, path, start, end))
    if is_async(fs):
        return start_coroutine(fs, _get_range_async(fs, path, start, end))
    return start_in_thread(lambda: _get_range(fs, path, start, end))


@dataclass(frozen=True, slots=True)
class _Pinned:
    """Ranged GETs of one version of an object only: s3fs's ``get_object`` with ``IfMatch``
    (the answer's ETag compared too), or an HTTP request with ``If-Match`` (else
    ``If-Unmodified-Since``); a refusal (HTTP 412) or another version raises
    ShardChangedError."""

    url: str
    version: ObjectVersion
    kind: str  # "s3" or "http"

    def _condition(self, *, s3: bool) -> dict[str, Any]:
        etag, modified = self.version.etag, self.version.modified
        if etag is not None:
            return {"IfMatch" if s3 else "If-Match": etag}
        if modified is None:
            return {}
        if s3:
            return {"IfUnmodifiedSince": datetime.datetime.fromtimestamp(
                modified, tz=datetime.timezone.utc)}
        return {"If-Unmodified-Since": email.utils.formatdate(modified, usegmt=True)}

    async def get_range(self, fs: Any, path: str, start: int, end: int) -> bytes:
        try:
            if self.kind == "s3":
                out, etag = await _s3_get(fs, path, start, end, self._condition(s3=True), None)
                found = object_version({"ETag": etag})
                if found is not None and self.version.differs(found):  # IfMatch ignored
                    raise changed_error(self.url, self.version, found)
            else:
                out = await bounded_get(fs, path, start, end, headers=self._condition(s3=False))
        except Exception as exc:
            if _refused_version(exc):
                raise changed_error(self.url, self.version, None) from None
            if isinstance(exc, OSError) and exc.errno == errno.EINVAL and start >= int(
                    await fs._size(path)):
                return b""
            raise
        if len(out) == end - start:
            return out
        return checked_answer(out, start, end, _size_or_none(await fs._size(path)))


def _refused_version(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is the store's HTTP 412: the version
    asked for is not there any more."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return False
        if getattr(current, "status", None) == 412:  # aiohttp
            return True
        answer = getattr(current, "response", None)
        if isinstance(answer, Mapping):  # botocore
            error = answer.get("Error") or {}
            meta = answer.get("ResponseMetadata") or {}
            if error.get("Code") in ("PreconditionFailed", "412") or meta.get(
                    "HTTPStatusCode") == 412:
                return True
        current = current.__cause__ or current.__context__
    return False


async def bounded_get(fs: Any, path: str, start: int, end: int | None, *,
                      headers: Mapping[str, str] | None = None,
                      limit: int | None = None) -> bytes:
    """Bytes ``[start, end)`` of ``path`` (``end`` None: the whole object, at most ``limit``
    bytes) on fsspec's HTTP or S3 filesystem, never holding more than that in memory: an
    answer that says (or turns out) to be longer is refused before (or while) its body is
    read: a whole object answered for a range is :class:`RangeIgnored`, a whole object over
    ``limit`` TooLarge, another length :class:`WrongLength`. Other filesystems: their
    ``_cat_file``."""
    if callable(getattr(fs, "_call_s3", None)):
        return (await _s3_get(fs, path, start, end, headers or {}, limit))[0]
    if type(fs).__name__ != "HTTPFileSystem":
        return bytes(await fs._cat_file(path, start=start, end=end))
    kw = fs.kwargs.copy()
    sent = {**(kw.pop("headers", None) or {}), **(headers or {})}
    if end is not None:
        sent["Range"] = f"bytes={start}-{end - 1}"
    session = await fs.set_session()
    async with session.get(fs.encode_url(path), headers=sent, **kw) as answer:
        fs._raise_not_found_for_status(answer, path)
        if answer.status == 416:
            raise OSError(errno.EINVAL, "range not satisfiable")
        if answer.status not in (200, 206):  # e.g. a redirect without a Location
            raise WrongLength(f"HTTP {answer.status} answered, not the bytes asked")
        cap = _cap(answer.status == 206, answer.content_length, start, end, limit)
        chunks, total = [], 0
        async for chunk in answer.content.iter_chunked(1 << 20):
            total += len(chunk)
            if total > cap:
                raise WrongLength(f"more than the {cap} bytes asked were answered")
            chunks.append(chunk)
    return b"".join(chunks)


def _cap(partial: bool, declared: int | None, start: int, end: int | None,
         limit: int | None) -> int:
    """The most bytes an answer to ``[start, end)`` may bring (see :func:`bounded_get`),
    judged from its headers before its body is read."""
    if end is None:  # a whole object
        cap = limit if limit is not None else current_read_limit()
        if declared is not None and declared > cap:
            raise too_large(declared, cap)
        return cap
    if not partial and (start > 0 or (declared is not None and declared > end - start)):
        raise RangeIgnored(f"HTTP 200 with {'an unsaid number of' if declared is None else declared}"
                           f" bytes for bytes {start}..{end}")
    return end - start


async def _s3_get(fs: Any, path: str, start: int, end: int | None, condition: Mapping[str, Any],
                  limit: int | None) -> tuple[bytes, str | None]:
    """:func:`bounded_get` on s3fs (``condition``: IfMatch and the like), and the ETag of
    the answer."""
    bucket, key, version_id = fs.split_path(path)
    extra = {"VersionId": version_id} if version_id else {}
    if end is not None:
        extra["Range"] = f"bytes={start}-{end - 1}"
    answer = await fs._call_s3("get_object", Bucket=bucket, Key=key, **extra, **condition)
    try:
        partial = answer.get("ContentRange") is not None or end is None
        cap = _cap(partial, answer.get("ContentLength"), start, end, limit)
        chunks, total = [], 0
        while total <= cap:  # a read gives what has arrived: up to the cap, then one more
            chunk = await answer["Body"].read(cap + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        answer["Body"].close()
    if total > cap:
        raise WrongLength(f"more than the {cap} bytes asked were answered")
    return b"".join(chunks), answer.get("ETag")


def _size_or_none(size: Any) -> int | None:
    return None if size is None else int(size)


async def _get_range_async(fs: Any, path: str, start: int, end: int) -> bytes:
    try:
        out = await bounded_get(fs, path, start, end)
    except OSError as exc:
        if exc.errno == errno.EINVAL and start >= int(await fs._size(path)):
            return b""
        raise
    if len(out) == end - start:
        return out
    return checked_answer(out, start, end, _size_or_none(await fs._size(path)))


def _get_range(fs: Any, path: str, start: int, end: int) -> bytes:
    try:
        out = bytes(fs.cat_file(path, start=start, end=end))
    except OSError as exc:
        if exc.errno == errno.EINVAL and start >= int(fs.size(path)):
            return b""
        raise
    if len(out) == end - start:
        return out
    return checked_answer(out, start, end, _size_or_none(fs.size(path)))
