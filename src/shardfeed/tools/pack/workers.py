"""Parallel, ordered map for ``pack``: threads or processes, results in input order.

Determinism: results come back in item order whatever the number of workers. Memory: at
most ``4 × workers`` results in flight.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Literal, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Threads or processes.
ExecutorKind = Literal["thread", "process"]

Runner = Callable[[Callable[[Any], Any], Sequence[Any]], Sequence[Any]]
"""``run(fn, items) -> [fn(item) for item in items]``, spread as the runner likes (the
``run=`` of ``index_files`` and ``verify``; ``shardfeed.tools.ray.ray_map`` is one)."""


def no_progress(n: int) -> None:
    """A progress callback that reports nowhere (work shipped to other processes)."""


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], *, workers: int, executor: ExecutorKind = "thread"
) -> Iterator[R]:
    """``map(fn, items)`` computed by ``workers`` threads or processes, yielded in order.

    At most ``4 × workers`` results are in flight. On error the pending work is cancelled
    and the first exception (in item order) propagates.

    Processes start with "forkserver" (or "spawn" where there is none), never a plain fork:
    forking a process that runs threads (JAX, torch, a progress bar) can deadlock the child.
    ``fn`` and the items must therefore pickle, and a script that packs with processes needs
    the usual ``if __name__ == "__main__":`` guard.
    """
    if workers == 1:
        yield from map(fn, items)
        return
    pool: Executor = (
        ThreadPoolExecutor(max_workers=workers) if executor == "thread"
        else ProcessPoolExecutor(max_workers=workers, mp_context=_process_context())
    )
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 4 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _process_context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
