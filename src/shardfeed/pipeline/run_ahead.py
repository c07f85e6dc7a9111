"""Batches made ahead of the caller on a thread of their own: the hand-out of a Loader whose
batch stages ask for it (a stage with ``ahead_batches > 0``, such as the GPU decode).

::

    run-ahead thread:  next(pass) -> stages(batch k) -> [queue: k, k+1, ...]   (bounded)
    caller:            next(loader) -> take k from the queue -> stages' hand_over(k) -> k

The thread pulls batches from the Loader's own pass (so the stages run on it, in order, ahead
of the caller, e.g. a decode on the device's side stream) and puts each one in a queue of at
most ``depth`` batches, with the Loader's counters as they stood just after it. The caller
takes them in order; each stage's ``hand_over`` is then called on the caller's thread (e.g.
the caller's CUDA stream waits on the batch's event).

State: the counters saved with the last batch the caller took (:attr:`RunAhead.handed`), so
``Loader.state()`` describes exactly the batches handed out, never the ones waiting in the
queue; closing puts those counters back into the Loader, and the batches made ahead are
dropped (a new pass makes them again, the same bytes). An exception in the thread reaches the
caller once every batch made before it was taken, with a note naming the batch (epoch, batch
index, first epoch position).

Determinism: the order and bytes of the pass; the thread changes only when a batch is ready.
Memory: at most ``depth`` made batches waiting, one being made, the one the caller holds.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardfeed.pipeline.batch_stage import RunAheadStage

__all__ = ["Counters", "RunAhead", "ahead_depth"]

Batch = dict[str, Any]
Counters = tuple[int, int, int]
"""``(epoch, consumed, skipped)``: the Loader's counters after some batch."""

_POLL_S = 0.05  # how often a blocked put looks whether the caller closed


@dataclass(slots=True)
class _Item:
    batch: Batch | None
    counters: Counters
    error: BaseException | None = None
    end: bool = False


def ahead_depth(stages: Sequence[Any]) -> int:
    """The batches to make ahead: the largest ``ahead_batches`` of the stages (0: none)."""
    return max((int(s.ahead_batches) for s in stages if isinstance(s, RunAheadStage)),
               default=0)


class RunAhead:
    """Iterate ``source`` (a Loader's pass) on a thread, at most ``depth`` batches ahead.

    ``counters()`` reads the Loader's counters (called on the thread right after each batch);
    ``start`` are the counters before the first batch; ``where(k)`` names batch ``k`` of this
    pass for an error note. See the module docstring.
    """

    def __init__(self, source: Iterator[Batch], *, depth: int, stages: Sequence[Any],
                 counters: Callable[[], Counters], where: Callable[[int], str]) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.depth = depth
        self.handed: Counters = counters()
        self._source = source
        self._stages = [s for s in stages if isinstance(s, RunAheadStage)]
        self._counters = counters
        self._where = where
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._work, name="shardfeed-run-ahead",
                                        daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Batches made and not yet taken (at most ``depth``)."""
        return self._queue.qsize()

    def _put(self, item: _Item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        index = 0
        while not self._stop.is_set():
            try:
                batch = next(self._source)
            except StopIteration:
                self._put(_Item(None, self._counters(), end=True))
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who re-raises
                exc.add_note(f"while making {self._where(index)} ahead of the caller")
                self._put(_Item(None, self._counters(), error=exc))
                return
            if not self._put(_Item(batch, self._counters())):
                return
            index += 1

    def __iter__(self) -> RunAhead:
        return self

    def __next__(self) -> Batch:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise StopIteration from None
        if item.error is not None:
            self._done = True
            raise item.error
        if item.end:
            self._done = True
            self.handed = item.counters
            raise StopIteration
        assert item.batch is not None
        batch = item.batch
        for stage in self._stages:
            batch = stage.hand_over(batch)
        self.handed = item.counters
        return batch

    def close(self) -> Counters:
        """Stop the thread (it finishes the batch it is making), drop the batches made ahead,
        and return the counters of the batches handed out."""
        self._stop.set()
        while self._thread.is_alive():
            self._drain()
            self._thread.join(timeout=_POLL_S)
        self._drain()
        self._done = True
        return self.handed

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return
