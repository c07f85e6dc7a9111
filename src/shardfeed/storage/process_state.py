"""What the storage package keeps for the process: two holders, one lock each, one fork rule.

::

    SETTINGS  (Settings)      what the user set on purpose: registered backends, the obstore
                              provider, storage options by URL prefix, the index cache.
                              A forked child keeps them.
    PROCESS   (ProcessState)  what this process made: obstore stores, the redirect refuser,
                              the storage calls in flight (a forked child starts with none);
                              and what it learnt: buckets' regions, whether obstore ran,
                              look-ups done once a process (still true in a forked child).

Every other module keeps no state of its own for the process, apart from its thread pools
(:class:`~shardfeed.storage.daemon_threads.DaemonThreads`), which follow the fork rule too
(``tests/storage/test_process_state.py`` checks both).

The fork rule: one ``os.register_at_fork`` hook (:meth:`ProcessState.after_fork_in_child`).
In a forked child, before any other code of the child runs, it renews both holders' locks
(one may have been held by a thread of the parent, which did not follow the fork), empties
what PROCESS made (the stores, the refuser and the calls are the parent's: their threads and
connections stayed there), notes whether obstore had run (obstore's runtime threads did not
follow either: the child must not call it, see ``obstore_stores.forked_after_use``), and
calls the reset each object holding something of the process's registered with
:meth:`ProcessState.at_fork` (a thread pool, a disk cache, an fsspec source, a dataset's open
shards, a decoded-image cache). A reset renews the object's locks and ends the work that was
in flight on the parent's threads with an error that says so (:func:`fail_forked`): a child
that waits for it gets that error, not a hang. Nothing else in the package looks for a fork,
nor compares pids.

Locks: each holder's ``lock`` guards its tables (dicts, sets, deques: every read or change
holds it), only for that (never across I/O, a call into a client library, or another lock);
a flag or a value looked up once is one assignment, read and written without it. Making an entry slowly the first time (a store, a bucket's region, the refuser) holds a
lock of that entry's only (:meth:`ProcessState.once`): one thread makes it, others asking for
the same entry wait, others go on.

Determinism: none needed (no data decided here). State: the two holders. Memory: a store
(one HTTP client) a bucket and configuration, a future a call in flight, a few bytes a
region and a resolved folder (at most :data:`REAL_FOLDERS`).
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from shardfeed.storage.cache import ByteCache

__all__ = ["PROCESS", "REAL_FOLDERS", "SETTINGS", "ProcessState", "Settings", "fail_forked"]

REAL_FOLDERS = 4096
"""Resolved local folders kept at most (see ``paths``)."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
Owner = TypeVar("Owner")


class Settings:
    """What the user set on purpose for the process (kept by a forked child). Backends are
    typed where they are registered (``backends``): this module imports no module using it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.backends: dict[str, Any] = {}
        """``scheme -> storage.backends.Backend`` (see ``register_backend``)."""
        self.obstore_provider: Callable[[str], Any] | None = None
        """How the obstore backend of a scheme is found (see ``set_obstore_provider``)."""
        self.storage_options: dict[str, dict[str, Any]] = {}
        """``URL prefix -> options`` (see ``set_storage_options``)."""
        self.index_cache: ByteCache | None = None
        """Where indexes read from object storage are kept (see ``set_index_cache``)."""


class ProcessState:
    """What this process made or learnt (see the module docstring for the fork rule)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stores: dict[tuple[str, str, str, str], Any] = {}
        """obstore's stores: one a scheme, bucket, configuration and client options."""
        self.regions: dict[tuple[str, str], str] = {}
        """``(endpoint, bucket) -> region``: buckets found in another region than asked."""
        self.ports: dict[str, int] = {}
        """``name -> port`` of the servers this process runs (the redirect refuser)."""
        self.refused: collections.deque[str] = collections.deque(maxlen=16)
        """The hosts of the last requests the redirect refuser refused."""
        self.wakes: set[Future[None]] = set()
        """The ``wake`` futures of the storage calls in flight (see ``inflight``)."""
        self.interrupts = 0
        """How many times every call in flight was interrupted (Ctrl-C)."""
        self.exiting = threading.Event()
        """Set once the interpreter exits: every storage call stops waiting."""
        self.obstore_used = False
        """A store was made in this process (obstore's runtime may run)."""
        self.forked_after_obstore = False
        """This process was forked from one that had used obstore."""
        self.obstore_installed: bool | None = None
        """Whether obstore imports (None: not looked up yet)."""
        self.transient_types: tuple[type[BaseException], ...] | None = None
        """The network errors of the optional clients installed (None: not looked up yet)."""
        self.umask: int | None = None
        """The process's umask, read once (reading it means setting it)."""
        self.real_folders: dict[str, str] = {}
        """``folder -> os.path.realpath(folder)``, as first seen (see ``paths``)."""
        self.pools: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        """The package's kept thread pools (``DaemonThreads``) and their names: the thread
        inventory (a forked child keeps the pools, emptied by their own reset)."""
        self._making: dict[tuple[int, Hashable], threading.Lock] = {}
        self._resets: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = (
            weakref.WeakKeyDictionary())

    def once(self, table: dict[K, V], key: K, make: Callable[[], V]) -> V:
        """``table[key]`` (one of this object's tables), made by ``make()`` the first time:
        one thread makes it while others asking for ``key`` wait; other keys do not wait. An
        exception from ``make`` leaves nothing behind (the next call tries again)."""
        with self.lock:
            if key in table:
                return table[key]
            making = self._making.setdefault((id(table), key), threading.Lock())
        with making:
            with self.lock:
                if key in table:
                    return table[key]
            value = make()
            with self.lock:
                table[key] = value
                self._making.pop((id(table), key), None)
            return value

    def at_fork(self, owner: Owner, reset: Callable[[Owner], None]) -> None:
        """Call ``reset(owner)`` in a forked child, until ``owner`` is collected: for objects
        that hold something of this process's (threads, a lock file, a connection)."""
        with self.lock:
            self._resets[owner] = reset

    def after_fork_in_child(self) -> None:
        """The fork rule (see the module docstring); the package's only at-fork hook."""
        self.lock = threading.Lock()
        SETTINGS.lock = threading.Lock()
        self.forked_after_obstore = self.forked_after_obstore or self.obstore_used
        self._making = {}
        for table in (self.stores, self.ports, self.wakes):
            table.clear()
        for owner, reset in list(self._resets.items()):
            reset(owner)


def fail_forked(futures: Iterable[Future[Any]], what: str, *,
                error: Callable[[], BaseException] | None = None) -> None:
    """In a forked child: end each of ``futures`` not done (work that was queued or running
    on a thread of the parent, which did not follow the fork) with ``error()``, by default a
    RuntimeError that says so, so that nothing in the child waits for it for ever. Each
    future gets a new lock first (a thread of the parent may have held its own at the fork,
    and the waiters it would wake are the parent's)."""
    for future in futures:
        if future.done():
            continue
        state = getattr(future, "__dict__", {})
        if "_condition" in state:  # concurrent.futures.Future's own lock and waiters
            state["_condition"] = threading.Condition()
            state["_waiters"] = []
        failure = error() if error is not None else RuntimeError(
            f"{what} was in flight on a thread of the parent process when it forked, and "
            "threads do not follow a fork: it never ends here. Start it again in this process "
            "(a Loader: a new pass, iter(loader); or make the Loader after the fork)")
        try:
            future.set_exception(failure)
        except InvalidStateError:  # done meanwhile (by a thread of the child)
            pass


SETTINGS = Settings()
PROCESS = ProcessState()
os.register_at_fork(after_in_child=PROCESS.after_fork_in_child)
