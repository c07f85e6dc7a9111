"""The thread inventory: every thread (and worker process) a Loader may run, by pool, with the
bound each pool keeps and the threads it has now (:meth:`Loader.thread_budget`).

Three scopes::

    loader    its CPU pool's slice threads (num_threads; at most the slice gate's limit
              build at once), the run-ahead thread of an adapter that asks for one, its
              worker processes (workers="processes")
    dataset   the shard readers of a dataset on object storage (max_concurrency) and its
              record fetches ahead (FETCH_THREADS)
    process   the package's kept pools, shared by every loader of the process
              (:func:`~shardfeed.storage.daemon_threads.pools`): Patches' decodes ahead,
              read-ahead scheduling, blocking storage calls, info calls, disk-cache reads and
              waits, each with a finite limit; and obstore's redirect refuser (one thread,
              and a short one for each request it refuses)

Threads are named by their pool (``shardfeed-<pool>``, an executor's with ``_<n>`` after
it), so the live threads of a process can be matched to the rows (the tests do).
Determinism: none needed. State: none (read from the pools when asked). Memory: none.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from shardfeed.storage.daemon_threads import pools
from shardfeed.storage.process_state import PROCESS


@dataclass(frozen=True)
class ThreadPoolRow:
    """One pool: the threads' name, its scope, the most threads (or processes) it runs, those
    it runs now, and what they do."""

    name: str
    scope: str
    most: int
    now: int
    why: str


@dataclass(frozen=True)
class ThreadBudget:
    """The pools a loader may run threads in (see the module doc)."""

    pools: tuple[ThreadPoolRow, ...]

    @property
    def most(self) -> int:
        """The most threads and processes of all pools together."""
        return sum(row.most for row in self.pools)

    @property
    def now(self) -> int:
        return sum(row.now for row in self.pools)

    def row(self, name: str) -> ThreadPoolRow | None:
        return next((row for row in self.pools if row.name == name), None)

    def __str__(self) -> str:
        lines = [f"{'pool':<26}{'scope':<9}{'most':>6}{'now':>6}  what"]
        lines += [f"{r.name:<26}{r.scope:<9}{r.most:>6}{r.now:>6}  {r.why}" for r in self.pools]
        lines.append(f"{'all':<26}{'':<9}{self.most:>6}{self.now:>6}")
        return "\n".join(lines)


def live_threads(name: str) -> int:
    """Threads of this process named by pool ``name`` (``name`` or ``name_<n>``)."""
    return sum(1 for t in threading.enumerate()
               if t.name == name or t.name.startswith(name + "_"))


def _executor_threads(executor: Any) -> int:
    return len(getattr(executor, "_threads", ()) or ())


def thread_budget(*, num_threads: int, workers: str, executor: Any, processes: Any,
                  run_ahead: bool, datasets: list[Any]) -> ThreadBudget:
    """The inventory of a loader (see :meth:`Loader.thread_budget`): its executor (a
    ``CpuPool`` or None before the first batch), its worker processes (None where none
    were started), whether a run-ahead thread runs, and its datasets (a mixture's several)."""
    from shardfeed.dataset.fetch_ahead import FETCH_THREADS

    rows = [
        ThreadPoolRow("shardfeed-loader", "loader", num_threads, _executor_threads(executor),
                      "build slices: read, decode, transform, write into the batch (at most "
                      "the slice gate's limit at once)"),
        ThreadPoolRow("shardfeed-run-ahead", "loader", 1, int(run_ahead),
                      "make the pass's batches ahead for an adapter's stage"),
    ]
    if workers == "processes":
        rows.append(ThreadPoolRow("worker processes", "loader", num_threads,
                                  len(getattr(getattr(processes, "pool", None), "_processes",
                                              None) or ()),
                                  "build samples in processes (workers='processes')"))
    remote = [s for s in (getattr(d, "_shards", None) for d in datasets)
              if s is not None and getattr(s, "remote", False)]
    if remote:
        rows.append(ThreadPoolRow(
            "shardfeed-shards", "dataset", sum(int(s.max_workers) for s in remote),
            sum(_executor_threads(getattr(s, "_pool", None)) for s in remote),
            "read shards on object storage (max_concurrency a dataset)"))
    fetchers = [f for f in (getattr(d, "_fetcher", None) for d in datasets) if f is not None]
    if fetchers:
        rows.append(ThreadPoolRow(
            "shardfeed-ahead", "dataset", FETCH_THREADS * len(fetchers),
            sum(_executor_threads(getattr(f, "_pool", None)) for f in fetchers),
            "fetch records ahead from object storage (FETCH_THREADS a dataset)"))
    rows += [ThreadPoolRow(pool.name, "process", pool.limit, pool.threads, pool.why)
             for pool in pools()]
    if "refuser" in PROCESS.ports:
        rows.append(ThreadPoolRow(
            "shardfeed-refuse-redirects", "process", 1, 1,
            "refuse obstore's requests for other hosts (redirects); each refused request "
            "also runs a short unnamed thread of its own while it is answered"))
    return ThreadBudget(tuple(rows))


__all__ = ["ThreadBudget", "ThreadPoolRow", "live_threads", "thread_budget"]
