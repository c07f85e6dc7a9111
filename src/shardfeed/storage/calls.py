"""Remote whole-file operations as calls with one deadline (the machinery of ``storage.files``).

An operation is started by a ``Start`` function, ``start(fs, path) -> Future``: a cancellable
task on an async filesystem's event loop, or a daemon thread (see
:mod:`shardfeed.storage.inflight`); :func:`remote_call` retries it under the current
:class:`~shardfeed.storage.retry.RetryPolicy` (the default, or that of the innermost
:func:`retry_policy` block) and waits at most its ``deadline_seconds``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from shardfeed.storage.inflight import is_async, start_coroutine, start_fs_call, start_in_thread
from shardfeed.storage.options import filesystem
from shardfeed.storage.ranges import current_read_limit, too_large
from shardfeed.storage.retry import Job, Retrier, RetryPolicy

T = TypeVar("T")
Options = Mapping[str, Any] | None

_POLICY: contextvars.ContextVar[RetryPolicy | None] = contextvars.ContextVar(
    "shardfeed_files_retry_policy", default=None
)


@contextlib.contextmanager
def retry_policy(policy: RetryPolicy | None, /) -> Iterator[None]:
    """Remote operations of this module inside the block (in this thread or task) retry under
    ``policy``, its ``deadline_seconds`` included, instead of the default ``RetryPolicy()``.
    None changes nothing."""
    if policy is not None and not isinstance(policy, RetryPolicy):
        raise TypeError(f"policy must be a RetryPolicy or None, got {type(policy).__name__}")
    token = _POLICY.set(policy if policy is not None else _POLICY.get())
    try:
        yield
    finally:
        _POLICY.reset(token)


Start = Callable[[Any, str], "Future[T]"]

_SCOPE: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "shardfeed_storage_options", default=None)


@contextlib.contextmanager
def storage_scope(storage_options: Mapping[str, Any] | None, /) -> Iterator[None]:
    """Operations of ``storage.files`` inside the block (in this thread or task) that are
    given no ``storage_options`` use these (a Dataset opens its manifest, indexes, listings
    and versions inside one, with its own ``source_options``' storage options). None changes
    nothing."""
    token = _SCOPE.set(storage_options if storage_options is not None else _SCOPE.get())
    try:
        yield
    finally:
        _SCOPE.reset(token)


def scoped(storage_options: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``storage_options``, else those of the innermost :func:`storage_scope` block."""
    return storage_options if storage_options is not None else _SCOPE.get()



def current_policy() -> RetryPolicy:
    """The policy of the innermost :func:`retry_policy` block, else ``RetryPolicy()``."""
    return _POLICY.get() or RetryPolicy()


def remote_filesystem(url: str, options: Options) -> tuple[Any, str]:
    """``(filesystem, path)`` for ``url``, its client fitted to the current deadline."""
    return filesystem(url, options, deadline_seconds=current_policy().deadline_seconds)


TRANSFER_BYTES_PER_SECOND = 1 << 20
"""A write or upload of n bytes gets n / this many seconds more than the deadline: sending a
large shard takes its time, and a server that stalls still fails in bounded time."""


def remote_call(url: str, options: Options, action: str, start: Start[T], *,
                send_bytes: int = 0) -> T:
    """The result of ``start(fs, path)``'s attempts for a remote URL, retried within the
    deadline of the current policy (longer by ``send_bytes / TRANSFER_BYTES_PER_SECOND``),
    with StorageError naming ``url``."""
    fs, path = remote_filesystem(url, scoped(options))
    job = Job(action, lambda: start(fs, path))
    return Retrier(call_policy(send_bytes), key=url).run([job], url=url)[0]


def call_policy(send_bytes: int = 0) -> RetryPolicy:
    """The current policy, its deadline longer by ``send_bytes / TRANSFER_BYTES_PER_SECOND``
    for a call that sends that many bytes."""
    policy = current_policy()
    if send_bytes <= 0:
        return policy
    return dataclasses.replace(policy, deadline_seconds=policy.deadline_seconds
                               + send_bytes / TRANSFER_BYTES_PER_SECOND)


def op(method: str, *args: Any, **kwargs: Any) -> Start[Any]:
    """``fs.<method>(path, *args, **kwargs)`` as an attempt (a cancellable task on async
    filesystems)."""
    return lambda fs, path: start_fs_call(fs, method, path, *args, **kwargs)


def in_thread(fn: Callable[[Any, str], T]) -> Start[T]:
    """``fn(fs, path)`` (several filesystem calls) as an attempt on a daemon thread."""
    return lambda fs, path: start_in_thread(lambda: fn(fs, path))


# A plain cat_file asks s3fs for the size first (a HEAD, to split big objects into parallel
# parts); an open-ended range ("bytes=0-") is one GET on every HTTP store. Some stores refuse
# any range of an empty object (HTTP 416, EINVAL): then a plain GET.


def start_cat_whole(fs: Any, path: str) -> Future[bytes]:
    limit = current_read_limit()  # read here: the caller's context, not the event loop's
    if is_async(fs):
        return start_coroutine(fs, _cat_whole_async(fs, path, limit))
    return start_in_thread(lambda: _cat_whole(fs, path, limit))


async def _cat_whole_async(fs: Any, path: str, limit: int) -> bytes:
    from shardfeed.storage.remote import bounded_get

    return await bounded_get(fs, path, 0, None, limit=limit)


def _cat_whole(fs: Any, path: str, limit: int) -> bytes:
    size = fs.size(path)
    if size is not None and int(size) > limit:
        raise too_large(int(size), limit)
    try:
        return bytes(fs.cat_file(path, start=0))
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return bytes(fs.cat_file(path))


__all__ = [
    "TRANSFER_BYTES_PER_SECOND",
    "call_policy",
    "current_policy",
    "in_thread",
    "op",
    "remote_call",
    "remote_filesystem",
    "retry_policy",
    "scoped",
    "start_cat_whole",
    "storage_scope",
]
