"""obstore (Rust ``object_store``) as the backend of s3://, gs://, az:// and http(s):// URLs.

The reader of ``s3://``, ``gs://``, ``az://`` and ``http(s)://`` URLs where obstore is
installed (``pip install 'shardfeed[s3]'`` or ``[obstore]``), unless ``SHARDFEED_OBSTORE=0``
(in every process, workers included: fsspec reads them then); :func:`use_obstore` registers
it for the process whatever that says. It reads the URLs whose options it has a counterpart of
(:func:`serves`; others, e.g. ``requester_pays``, go to fsspec). The store of a URL (its
configuration, credentials, bucket's region and certificate authorities) is made by
:mod:`~shardfeed.storage.obstore_stores`; a request S3 refuses for the bucket's region is
sent again, once, to the store of the region it names::

    from shardfeed.storage.obstore_backend import use_obstore

    use_obstore()                      # s3://, gs://, az://, http(s):// through obstore
    ds = shardfeed.Dataset("s3://bucket/dataset")

Ranged reads of an object merge ranges whose holes are small (as
:mod:`~shardfeed.storage.ranges` merges them); each merged range is one GET, :data:`IN_FLIGHT`
at once, its body streamed and refused as soon as it runs past the range (memory follows the
ranges asked, whatever length the server says). Sizes are one HEAD, remembered; whole objects
one GET, refused from their size past the read's limit. Once pinned (:meth:`ObstoreSource.pin`,
as a Dataset pins its shards), each GET asks for that version (``If-Match`` of its ETag, else
``If-Unmodified-Since`` of its modification time) and the version of each answer is
compared: a rewritten object raises :class:`~shardfeed.errors.ShardChangedError`.
Credentials and the endpoint come from the environment as obstore reads them
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...), and from ``storage_options`` (given, or
registered with ``set_storage_options`` and the ``FSSPEC_*`` variables as for fsspec) in
s3fs's words (``key``, ``secret``, ``token``, ``anon``, ``endpoint_url``,
``client_kwargs={"endpoint_url": ..., "region_name": ...}``, ``config_kwargs``' timeouts)
or obstore's (``obstore_config={...}``).

Deadlines, retries and Ctrl-C, as everywhere in the storage layer: obstore makes one attempt
a call (connect and idle-read timeouts of a quarter of the deadline, at most 5 s / 15 s, so
that a stalled attempt fails in time for a retry; the whole request is bounded by the
deadline only). The storage layer's :class:`~shardfeed.storage.retry.Retrier` runs it on a
daemon thread and retries transient failures (no answer, HTTP 5xx and 429) under the
source's ``retries``, backoff and one ``deadline_seconds`` a call, counting them in
``stats()``; a wrong configuration or region, a refused credentials request and a whole
object answered for a range are not retried. Ctrl-C and ``close()`` end the wait at once; a
failure is a :class:`~shardfeed.errors.StorageError` naming the URL (a missing object's
raised from a ``FileNotFoundError``).

Determinism: the bytes of a range do not depend on merging or concurrency. State: the
remembered size; one store a bucket and options, kept for the process. Memory: the ranges in
flight.
"""

from __future__ import annotations

import datetime
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from shardfeed.errors import StorageError
from shardfeed.storage.backends import obstore_backend, register_backend
from shardfeed.storage.calls import call_policy
from shardfeed.storage.inflight import CallGroup, start_in_thread
from shardfeed.storage.obstore_stores import (
    ObstoreRefused,
    _first_line,
    _learn_region,
    _module,
    _store,
    forked_after_use,
    installed,
    is_panic,
    serves,
)
from shardfeed.storage.ranges import (
    DEFAULT_COALESCE_GAP_BYTES,
    DEFAULT_MAX_REQUEST_BYTES,
    RangeIgnored,
    ShortAnswer,
    WrongLength,
    check_range,
    checked_answer,
    coalesce_ranges,
    current_read_limit,
    split_answers,
    too_large,
)
from shardfeed.storage.redirect_guard import REFUSED_MARK
from shardfeed.storage.retry import DEFAULT_DEADLINE_SECONDS, Job, Retrier, RetryPolicy
from shardfeed.storage.versions import ObjectVersion, changed_error, obstore_version

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "SCHEMES",
    "ObstoreRefused",
    "ObstoreSource",
    "installed",
    "serves",
    "use_obstore",
]

T = TypeVar("T")
SCHEMES = ("s3", "gs", "az", "http", "https")
IN_FLIGHT = 10
"""Requests of one ``read_ranges`` in flight at once (as many as obstore's own
``get_ranges`` keeps): each a ``get`` of its own, streamed and bounded by its range."""


def _in_region(url: str, storage_options: Mapping[str, Any] | None, deadline_seconds: float,
               op: Callable[[Any, str], T], *,
               opened: Callable[[], tuple[Any, str]] | None = None,
               moved: Callable[[Any, str], None] | None = None) -> Callable[[], T]:
    """One attempt at ``op(store, path)`` with the store of ``url`` (``opened()``, else
    looked up), judged (see :func:`_judged`); refused for the bucket's region, the region is
    learnt and the request sent again once, to the store of that region (given to
    ``moved``)."""

    def attempt() -> T:
        store, path = opened() if opened is not None else _store(url, storage_options,
                                                                  deadline_seconds)
        try:
            return _judged(lambda: op(store, path))()
        except WrongRegion:
            _learn_region(url, storage_options, deadline_seconds)
            store, path = _store(url, storage_options, deadline_seconds)
            if moved is not None:
                moved(store, path)
            try:
                return _judged(lambda: op(store, path))()
            except WrongRegion as exc:
                raise ObstoreRefused(
                    f"{exc}, in the bucket's own region too; check the endpoint") from None

    return attempt


class WrongRegion(Exception):
    """The server refused a request signed for another region than the bucket's (S3's 301
    without a Location): the region is learnt and the request sent again."""


class ServerAnswer(Exception):
    """An obstore call the server answered with an error status (``status``: the HTTP code;
    5xx and 429 are retried, the others are not)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# what obstore says when no answer came, or a short one: worth another attempt
_NO_ANSWER = ("error sending request", "timed out", "timeout", "connection", "Connection",
              "error decoding response body", "end of file", "IncompleteBody", "broken pipe",
              ", got ")


# S3's answers to a request signed for another region than the bucket's
_WRONG_REGION = ("incorrectly configured region", "AuthorizationHeaderMalformed")
_RETRY_TIMEOUT = re.compile(r"retry_timeout: [^,\n]*")
_STATUS = re.compile(r"status code: (\d{3})")
_METADATA_SERVICE = "169.254.169.254"
"""Where obstore asks for credentials when it has none (an EC2 instance's metadata)."""


def _judged(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` with obstore's failures as the storage layer judges them: a missing object a
    FileNotFoundError, refused access a PermissionError, an error status a
    :class:`ServerAnswer`, a whole object for a range :class:`RangeIgnored`, no answer
    (refused, reset, timed out) a ConnectionError; a redirect to another host refused (see
    :mod:`~shardfeed.storage.obstore_stores`) and a panic of obstore's Rust code (pyo3's
    PanicException, a BaseException) an :class:`ObstoreRefused`."""

    def guarded() -> T:
        try:
            return fn()
        except BaseException as exc:
            text = str(exc)
            if REFUSED_MARK in text:
                where = text.split(REFUSED_MARK, 1)[1].split("\n", 1)[0].strip()
                raise ObstoreRefused(
                    f"the server redirected the request {where}; a signed request is never "
                    "followed to another host (it would carry the credentials there): check "
                    "the endpoint, or give the host the data is on as the endpoint") from None
            if is_panic(exc):  # a BaseException: judged here, or nothing upstream catches it
                raise ObstoreRefused(f"obstore failed on this request: {_first_line(exc)}; "
                                     "check the endpoint, region and credentials") from None
            raise

    return _named(guarded)


def _named(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` with obstore's exceptions as the kinds the storage layer judges (see
    :func:`_judged`)."""
    errors = _module().exceptions

    def attempt() -> T:
        try:
            return fn()
        except (FileNotFoundError, errors.NotFoundError) as exc:
            raise FileNotFoundError(_first_line(exc)) from None
        except (errors.PermissionDeniedError, errors.UnauthenticatedError) as exc:
            raise PermissionError(_first_line(exc)) from None
        except errors.GenericError as exc:
            # (every debug dump names the retry_timeout: not a sign of no answer)
            text, line = _RETRY_TIMEOUT.sub("", str(exc)), _first_line(exc)
            if "non-partial response" in text:  # a 200 with the whole object for a range
                raise RangeIgnored(line) from None
            if any(word in text for word in _WRONG_REGION):
                raise WrongRegion(line) from None
            if "InvalidCertificate" in text:  # not the server's silence: not retried
                raise ObstoreRefused(
                    f"the server's TLS certificate is not trusted ({line}); for a private "
                    "certificate authority set AWS_CA_BUNDLE to a PEM file of it") from None
            if _METADATA_SERVICE in text:  # no credentials anywhere else: asked the instance
                raise ObstoreRefused(  # metadata service, which answered no or not at all
                    "no AWS credentials found (none in the storage options, the environment, "
                    f"AWS_PROFILE or ~/.aws, and the instance metadata service gave none): "
                    f"{line}") from None
            status = _STATUS.search(text)
            if status is not None:
                code = int(status.group(1))
                raise ServerAnswer(f"the server answered HTTP {code}: {line}", code) from None
            if any(word in text for word in _NO_ANSWER):
                raise ConnectionError(line) from None
            raise ObstoreRefused(line) from None
        except errors.BaseError as exc:  # configuration, path, precondition: not retried
            raise ObstoreRefused(_first_line(exc)) from None

    return attempt


class ObstoreSource:
    """Random access to one object through obstore (see the module docstring). Thread-safe."""

    def __init__(self, url: str, *, deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
                 retries: int | None = None, backoff_seconds: float = 0.1,
                 max_backoff_seconds: float = 10.0,
                 coalesce_gap_bytes: int = DEFAULT_COALESCE_GAP_BYTES,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 storage_options: Mapping[str, Any] | None = None,
                 max_concurrency: int | None = None) -> None:
        self.url = url
        self.policy = RetryPolicy(retries=retries, backoff_seconds=backoff_seconds,
                                  max_backoff_seconds=max_backoff_seconds,
                                  deadline_seconds=deadline_seconds)
        self.deadline_seconds = self.policy.deadline_seconds
        self.coalesce_gap_bytes = int(coalesce_gap_bytes)
        self.max_request_bytes = int(max_request_bytes)
        self._obstore = _module()
        self._storage_options = storage_options
        self._store: Any = None
        self._path = ""
        if not forked_after_use():  # (a source of a forked child's is refused at its reads)
            self._store, self._path = _store(url, storage_options, self.deadline_seconds)
        self._retrier = Retrier(self.policy, key=url)
        self._calls = CallGroup()
        self._size: int | None = None
        self._pinned: ObjectVersion | None = None
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_fetched = 0
        self.seconds = 0.0

    def _call(self, action: str, op: Callable[[Any, str], T]) -> T:
        """``op(store, path)`` under the retry policy, in the bucket's region."""
        attempt = _in_region(self.url, self._storage_options, self.deadline_seconds, op,
                             opened=self._opened, moved=self._moved)
        return self._retrier.call(attempt, url=self.url, action=action, group=self._calls)

    def _opened(self) -> tuple[Any, str]:
        return self._store, self._path

    def _moved(self, store: Any, path: str) -> None:
        self._store, self._path = store, path

    def _here(self) -> None:
        """StorageError in a process forked after obstore ran: a source (its store, its
        runtime's threads) belongs to the process that opened it; a call here would wait for
        ever. A Dataset opens its shards again in the child (see ``OpenShards``)."""
        if forked_after_use():
            raise StorageError(
                f"cannot read '{self.url}' with a source opened before this process was "
                "forked (obstore's threads do not follow a fork); open it again here with "
                "open_source(url), or start worker processes with 'spawn' or 'forkserver'")

    def stats(self) -> dict[str, float]:
        """``requests`` (ranges asked of the store), ``bytes_fetched``, ``retries``,
        ``seconds``, as RemoteSource counts them."""
        with self._lock:
            return {"requests": self.requests, "bytes_fetched": self.bytes_fetched,
                    "retries": self._retrier.retries_done, "seconds": self.seconds}

    def size(self) -> int:
        """The object's size: one HEAD, remembered."""
        self._here()
        if self._size is None:
            meta = self._call("get the size of", self._obstore.head)
            self._size = int(meta["size"])
        return self._size

    def pin(self, expected: ObjectVersion | None = None) -> ObjectVersion | None:
        """Read only the version there now (one HEAD, which gives the size too); see
        :class:`~shardfeed.storage.base.PinnedSource`."""
        self._here()
        meta = self._call("get the size and version of", self._obstore.head)
        found = obstore_version(meta)
        if expected is not None and found is not None and expected.differs(found):
            raise changed_error(self.url, expected, found)
        with self._lock:
            self._size = int(meta["size"])
            self._pinned = found
        return found

    def read(self, offset: int, length: int) -> bytes:
        return self.read_ranges([(offset, length)])[0]

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self._here()
        for offset, length in ranges:
            check_range(offset, length)
        plan = coalesce_ranges(ranges, gap_bytes=self.coalesce_gap_bytes,
                               max_request_bytes=self.max_request_bytes)
        if not plan:  # nothing asked, or only empty ranges
            return [b""] * len(ranges)
        pinned = self._pinned
        started = time.perf_counter()
        blobs = self._retrier.run(
            [Job(f"read bytes {r.start}..{r.end} of", self._ranged_get(pinned, r.start, r.end))
             for r in plan], url=self.url, max_in_flight=IN_FLIGHT, group=self._calls)
        with self._lock:
            self.requests += len(plan)
            self.bytes_fetched += sum(len(b) for b in blobs)
            self.seconds += time.perf_counter() - started
        return split_answers(ranges, plan, blobs)

    def _ranged_get(self, pinned: ObjectVersion | None, start: int, end: int
                    ) -> Callable[[], Any]:
        """A job's start: one attempt at bytes ``[start, end)`` (of version ``pinned`` only,
        where given), on a thread of its own. The body is read as a stream and refused as
        soon as it runs past the range (a server may say any Content-Length): memory
        follows the range asked."""
        options: dict[str, Any] = {"range": (start, end)}
        if pinned is not None and pinned.etag is not None:
            options["if_match"] = pinned.etag
        elif pinned is not None and pinned.modified is not None:  # a store without ETags
            options["if_unmodified_since"] = datetime.datetime.fromtimestamp(
                pinned.modified, tz=datetime.timezone.utc)
        refused = self._obstore.exceptions.PreconditionError
        want = end - start

        def get(store: Any, path: str) -> Any:
            try:
                answer = self._obstore.get(store, path, options=options)
            except refused:
                if pinned is None:
                    raise
                raise changed_error(self.url, pinned, None) from None
            found = obstore_version(answer.meta)
            if pinned is not None and found is not None and pinned.differs(found):
                raise changed_error(self.url, pinned, found)  # a store ignoring If-Match
            chunks, got = [], 0
            for chunk in answer.stream(min_chunk_size=want):
                got += len(chunk)
                if got > want:
                    raise WrongLength(f"more than the {want} bytes asked for bytes "
                                      f"{start}..{end} were answered")
                chunks.append(chunk)
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if got == want:
                return data
            return checked_answer(memoryview(data), start, end,  # type: ignore[arg-type]
                                  int(answer.meta["size"]))

        attempt = _in_region(self.url, self._storage_options, self.deadline_seconds, get,
                             opened=self._opened, moved=self._moved)
        return lambda: start_in_thread(attempt)

    def close(self) -> None:
        """Idempotent; a read waiting in another thread ends at once with a StorageError."""
        self._calls.cancel_all()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ObstoreSource({self.url!r})"


def _read_bytes(url: str, storage_options: Mapping[str, Any] | None) -> bytes:
    """The whole object, under the current policy (a Dataset opens its manifest and indexes
    within its own ``deadline_seconds``)."""
    limit = current_read_limit()

    def whole(store: Any, path: str) -> bytes:
        answer = _module().get(store, path)
        size = int(answer.meta["size"])
        if size > limit:  # refused before its body is read
            raise too_large(size, limit)
        data = bytes(answer.bytes())
        if len(data) != size:
            raise ShortAnswer(f"{len(data)} bytes answered for an object of {size} bytes")
        return data

    return store_call(url, storage_options, "read", whole)


def _size(url: str, storage_options: Mapping[str, Any] | None) -> int:
    return store_call(url, storage_options, "get the size of",
                      lambda store, path: int(_module().head(store, path)["size"]))


def store_call(url: str, storage_options: Mapping[str, Any] | None, action: str,
               op: Callable[[Any, str], T], *, send_bytes: int = 0) -> T:
    """``op(store, path)`` for ``url``: one call of ``storage.files`` (a whole read, a size,
    a listing, a write), retried under the current policy (its deadline longer for the
    bytes sent), in the bucket's region; a wrong configuration raises at once."""
    policy = call_policy(send_bytes)
    _store(url, storage_options, policy.deadline_seconds)
    attempt = _in_region(url, storage_options, policy.deadline_seconds, op)
    return Retrier(policy, key=url).call(attempt, url=url, action=action)


def use_obstore(schemes: Sequence[str] = SCHEMES) -> None:
    """Read URLs of ``schemes`` through obstore from now on, in this process."""
    _module()
    for scheme in schemes:
        backend = obstore_backend(scheme)
        assert backend is not None  # obstore imports: the provider gives its backend
        register_backend([scheme], backend)
