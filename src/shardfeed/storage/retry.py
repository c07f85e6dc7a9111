"""Retries for object storage: error classification, the retry policy with its deadline, and
StorageError messages.

Every request of a storage call (one byte range, one whole-file operation) has one deadline,
``deadline_seconds`` (default 60 s), that covers all of it: every attempt and every wait
between attempts. Transient failures (refused or dropped connections, timeouts, HTTP 5xx/429)
are retried with exponential backoff and jitter while the deadline allows; permanent ones (no
such bucket or key, access denied) raise :class:`~shardfeed.errors.StorageError` at once,
naming the URL. A call still unanswered at its deadline is abandoned and raises a
StorageError naming the URL, what was asked (the byte range), the attempts, the time spent
and the last error. The client library's own timeouts and retries are set to fit inside the
deadline (see :func:`shardfeed.storage.options.client_options`).

::

    deadline_seconds = 10
    |-- attempt 1 (refused) --|~wait~|-- attempt 2 (refused) --|~~wait~~|-- attempt 3 ... |
    0 s                                                                            10 s: abandon

The caller only ever waits on futures (:mod:`shardfeed.storage.inflight`), so Ctrl-C and
``close()`` end the wait at once.
"""

from __future__ import annotations

import heapq
import logging
import math
import random
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shardfeed.errors import StorageError
from shardfeed.storage.failures import (
    deadline_error,
    describe,
    is_transient,
    redact,
    redacted_exception,
    storage_error,
)
from shardfeed.storage.inflight import (
    CallGroup,
    ClosedError,
    cancelled,
    exiting,
    interrupts,
    start_in_thread,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_DEADLINE_SECONDS = 60.0
"""How long one storage call may take, all attempts and waits included, unless told."""

def _check_seconds(name: str, value: object, *, positive: bool) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (value > 0 if positive else value >= 0))
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How the requests of a storage call are retried, and how long each may take in all.

    ``deadline_seconds``: the most one request (every attempt and every wait between them)
    may take, from its first attempt; past it the call is abandoned with a StorageError. A
    call of one request (``read``, ``size``, a whole-file read) ends within it; a call of many
    (``read_ranges``) ends within it when the server stalls, and may take longer only while
    requests keep succeeding. ``retries``: at most this many attempts after the first (None:
    as many as fit in the deadline). The wait before retry i
    (0-based) is ``min(max_backoff_seconds, backoff_seconds * 2**i)`` times a jitter factor in
    [0.5, 1), drawn from a private generator keyed by the URL; a retry whose wait would end
    past the deadline is not made (the call fails then, before its deadline).
    """

    retries: int | None = None
    backoff_seconds: float = 0.1
    max_backoff_seconds: float = 10.0
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS

    def __post_init__(self) -> None:
        if self.retries is not None and (
            isinstance(self.retries, bool) or not isinstance(self.retries, int)
            or self.retries < 0
        ):
            raise ValueError(
                f"retries must be an int >= 0, or None to retry until deadline_seconds, got "
                f"{self.retries!r}"
            )
        _check_seconds("backoff_seconds", self.backoff_seconds, positive=False)
        if not self.max_backoff_seconds >= self.backoff_seconds:
            raise ValueError(
                f"max_backoff_seconds must be >= backoff_seconds ({self.backoff_seconds}), "
                f"got {self.max_backoff_seconds!r}"
            )
        _check_seconds("deadline_seconds", self.deadline_seconds, positive=True)

    def delay(self, attempt: int, jitter: float) -> float:
        """Seconds to wait before retry ``attempt`` (0-based), with ``jitter`` in [0, 1)."""
        cap = min(self.max_backoff_seconds, self.backoff_seconds * 2.0**attempt)
        return cap * (0.5 + 0.5 * jitter)

    def worst_case_wait_seconds(self) -> float:
        """The most time all waits of one call can add up to (the deadline bounds it too)."""
        if self.retries is None:
            return self.deadline_seconds
        waits = sum(
            min(self.max_backoff_seconds, self.backoff_seconds * 2.0**i)
            for i in range(self.retries)
        )
        return min(waits, self.deadline_seconds)


@dataclass(frozen=True, slots=True)
class Job(Generic[T]):
    """One request of a call: ``start()`` begins an attempt and returns its future (see
    :mod:`shardfeed.storage.inflight`); ``action`` names it in messages ("read bytes 0..9 of")."""

    action: str
    start: Callable[[], Future[T]]


class Retrier:
    """Runs storage calls under a :class:`RetryPolicy`; jitter from a private generator keyed
    by URL. Thread-safe; ``retries_done`` counts the retries made so far."""

    def __init__(self, policy: RetryPolicy, *, key: str) -> None:
        self.policy = policy
        self._rng = random.Random(zlib.crc32(key.encode("utf-8", "surrogatepass")))
        self._lock = threading.Lock()
        self.retries_done = 0

    def call(self, fn: Callable[[], T], *, url: str, action: str,
             group: CallGroup | None = None) -> T:
        """``fn()`` on a daemon thread, retried under the policy; the caller waits at most
        ``deadline_seconds``. Failures raise StorageError naming ``url``."""
        job = Job(action, lambda: start_in_thread(fn))
        return self.run([job], url=url, group=group)[0]

    def run(self, jobs: Sequence[Job[T]], *, url: str, max_in_flight: int = 1,
            group: CallGroup | None = None) -> list[T]:
        """The results of ``jobs``, at most ``max_in_flight`` attempts running at once, each
        job within ``deadline_seconds`` of its first attempt.

        A transient failure of one job retries that job after its backoff; the first
        permanent failure, an exhausted budget, the deadline, or ``group.cancel_all()``
        raise StorageError and cancel the attempts still running; so does Ctrl-C
        (KeyboardInterrupt goes through unchanged). The caller's thread only waits on futures.
        """
        group = group if group is not None else CallGroup()
        try:
            wake = group.enter()
        except ClosedError:
            action = jobs[0].action if jobs else "read"
            raise StorageError(redact(
                f"cannot {action} '{url}': it was closed; open it again with open_source(url)"
            )) from None
        try:
            return _Call(self, jobs, url=url, wake=wake, group=group,
                         max_in_flight=max_in_flight).run()
        finally:
            group.leave(wake)

    def _jitter(self) -> float:
        with self._lock:
            return self._rng.random()

    def _count_retry(self) -> None:
        with self._lock:
            self.retries_done += 1


class _Call(Generic[T]):
    """The state of one :meth:`Retrier.run`: what is running, waiting, done.

    Each job's deadline starts with its first attempt (a job queued behind
    ``max_in_flight`` others has not started waiting on the server yet).
    """

    def __init__(self, retrier: Retrier, jobs: Sequence[Job[T]], *, url: str,
                 wake: Future[None], group: CallGroup, max_in_flight: int) -> None:
        self.retrier = retrier
        self.group = group
        self.interrupts = interrupts()
        self.policy = retrier.policy
        self.jobs = jobs
        self.url = url
        self.wake = wake
        self.max_in_flight = max(1, max_in_flight)
        self.began = time.monotonic()
        self.results: dict[int, T] = {}
        self.attempts = [0] * len(jobs)
        self.deadlines = [math.inf] * len(jobs)  # set at each job's first attempt
        self.errors: list[BaseException | None] = [None] * len(jobs)
        self.ready = deque(range(len(jobs)))
        self.later: list[tuple[float, int]] = []  # (when, job) retries waiting their turn
        self.running: dict[Future[T], int] = {}

    def run(self) -> list[T]:
        try:
            while len(self.results) < len(self.jobs):
                now = time.monotonic()
                if self.wake.done():
                    raise self._stopped()
                while self.later and self.later[0][0] <= now:
                    self.ready.append(heapq.heappop(self.later)[1])
                self._start_ready(now)
                timeout = math.inf
                for i in self.running.values():
                    if self.deadlines[i] <= now:
                        raise self._too_late(i, now, still_waiting=True)
                    timeout = min(timeout, self.deadlines[i] - now)
                if self.later:
                    timeout = min(timeout, self.later[0][0] - now)
                waited: list[Future[Any]] = [self.wake, *self.running]
                # every unfinished job is running or waiting its retry: the timeout is finite
                done, _ = wait(waited, timeout=None if math.isinf(timeout) else timeout,
                               return_when=FIRST_COMPLETED)
                for future in done:
                    if future is not self.wake:
                        self._finished(future)
            return [self.results[i] for i in range(len(self.jobs))]
        finally:
            for future in self.running:
                # abandoned: cancels the task (async) or drops the daemon thread's result
                # (an obstore attempt ends by its own timeouts)
                future.cancel()

    def _start_ready(self, now: float) -> None:
        while self.ready and len(self.running) < self.max_in_flight:
            i = self.ready.popleft()
            if not self.attempts[i]:
                self.deadlines[i] = now + self.policy.deadline_seconds
            self.attempts[i] += 1
            try:
                future = self.jobs[i].start()
            except Exception as exc:  # noqa: BLE001 - judged like a failed attempt
                failed: Future[T] = Future()
                failed.set_exception(exc)
                future = failed
            self.running[future] = i

    def _finished(self, future: Future[T]) -> None:
        i = self.running.pop(future)
        if future.cancelled():  # cancelled by someone else than this call: stop
            raise self._stopped()
        exc = future.exception()
        if exc is None:
            self.results[i] = future.result()
            return
        action = self.jobs[i].action
        if not isinstance(exc, Exception):
            raise exc
        if isinstance(exc, StorageError):  # built by a backend: its text may hold a URL too
            raise redacted_exception(exc)
        if not is_transient(exc):
            raise storage_error(self.url, exc, action=action) from redacted_exception(exc)
        self.errors[i] = exc
        now = time.monotonic()
        retries = self.policy.retries
        if retries is not None and self.attempts[i] > retries:
            raise storage_error(self.url, exc, action=action, attempts=self.attempts[i],
                                elapsed_seconds=self._elapsed(i, now)
                                ) from redacted_exception(exc)
        wait_seconds = self.policy.delay(self.attempts[i] - 1, self.retrier._jitter())
        if now + wait_seconds >= self.deadlines[i]:
            raise self._too_late(i, now, still_waiting=False) from redacted_exception(exc)
        logger.debug(
            "%s '%s' failed (%s); retry %d in %.2f s", action, redact(self.url), describe(exc),
            self.attempts[i], wait_seconds,
        )
        self.retrier._count_retry()
        heapq.heappush(self.later, (now + wait_seconds, i))

    def _elapsed(self, i: int, now: float) -> float:
        return now - (self.deadlines[i] - self.policy.deadline_seconds)

    def _too_late(self, i: int, now: float, *, still_waiting: bool) -> StorageError:
        return deadline_error(
            self.url, action=self.jobs[i].action, deadline_seconds=self.policy.deadline_seconds,
            attempts=self.attempts[i], elapsed_seconds=self._elapsed(i, now),
            last_error=self.errors[i], still_waiting=still_waiting,
            unfinished=len(self.jobs) - len(self.results),
        )

    def _stopped(self) -> StorageError:
        unfinished = [i for i in range(len(self.jobs)) if i not in self.results]
        i = unfinished[0] if unfinished else 0
        if exiting():
            why = "the interpreter is exiting"
        elif self.group.closed:
            why = "it was closed while the call was running; open it again with open_source(url)"
        elif interrupts() != self.interrupts:
            why = "interrupted (Ctrl-C)"
        elif cancelled():
            why = "the loader's pass it read for was ended (closed, or stopped by an error)"
        else:
            why = "the call was cancelled"
        return StorageError(redact(
            f"cannot {self.jobs[i].action} '{self.url}' ({self.attempts[i]} attempt(s) in "
            f"{time.monotonic() - self.began:.1f} s): {why}"
        ))


__all__ = [
    "DEFAULT_DEADLINE_SECONDS",
    "Job",
    "Retrier",
    "RetryPolicy",
    "deadline_error",
    "is_transient",
    "storage_error",
]
