"""The Loader's worker pools and batch ring: opening them, and releasing them safely.

Threads plan, read and (with ``workers="threads"``) build slices; with
``workers="processes"`` a :class:`~shardfeed.pipeline.workers.ProcessWorkers` pool builds
them into a ring of batch buffers in shared memory. Determinism: none of this affects the
output bytes. State: none beyond the pools themselves. Memory: the ring holds
``prefetch_batches + 1`` batches.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shardfeed.pipeline.batching import BatchBuffer, BatchLayout, SharedBatchRing, local_ring
from shardfeed.pipeline.options import LoaderOptions
from shardfeed.pipeline.produce import SliceBuilder


def thread_pool(options: LoaderOptions) -> ThreadPoolExecutor:
    """The loader's thread pool: ``num_threads`` threads named ``shardfeed-loader``."""
    return ThreadPoolExecutor(
        max_workers=options.num_threads, thread_name_prefix="shardfeed-loader"
    )


def open_ring(
    builder: SliceBuilder, layout: BatchLayout, options: LoaderOptions
) -> tuple[list[BatchBuffer], Any, SharedBatchRing | None]:
    """The ring of ``prefetch_batches + 1`` batch buffers, the process pool, the shared ring.

    With ``workers="threads"`` the buffers are local and the other two are None.
    """
    size = options.prefetch_batches + 1
    if options.workers != "processes":
        return local_ring(layout, size), None, None
    from shardfeed.pipeline.workers import ProcessWorkers

    shared = SharedBatchRing(layout, size)
    try:
        processes = ProcessWorkers(
            builder, layout, shared.names, shared.buffers, processes=options.num_threads,
        )
    except BaseException:
        shared.close()  # the workers did not start: free the shared ring now
        raise
    return shared.buffers, processes, shared


def release(parts: list[Any], *, wait: bool = False) -> None:
    """Stop the loader's pools and free its shared memory.

    ``parts`` is ``[executor, processes, shared]`` (any may be None). ``wait=True``
    (``close()``) joins the worker threads and processes. The garbage collector calls it with
    ``wait=False``: a collection can run inside any allocation, including inside
    ``threading``'s own bookkeeping while it holds its internal locks, where joining a thread
    (or starting one) deadlocks; so then the pools are only told to stop, and their threads
    end by themselves once their current task has returned.
    """
    executor, processes, shared = parts
    if wait:
        current = threading.current_thread()
        pool_threads = set(getattr(executor, "_threads", ()))
        manager = getattr(getattr(processes, "pool", None), "_executor_manager_thread", None)
        wait = current not in pool_threads and current is not manager  # never join oneself
    if processes is not None:
        processes.pool.shutdown(wait=wait, cancel_futures=True)
    if executor is not None:
        executor.shutdown(wait=wait, cancel_futures=True)
    if shared is not None:
        # close() keeps any mapping a batch still views alive (see SharedBatchRing.close)
        shared.close()
