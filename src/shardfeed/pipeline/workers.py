"""Process workers: run ``make_sample`` (decode + transform) in other processes.

For transforms written in Python that hold the GIL. The Loader's threads still plan and read
(one coalesced read per slice, as with threads); each thread then hands its slice's records to
a worker process, which builds the samples and writes their array columns straight into the
batch buffer in shared memory (``multiprocessing.shared_memory``). Only the list columns
(bytes, strings) and errors travel back through a pipe.

Processes start with the ``spawn`` method (safe with threads; no inherited locks), so the
sampler and the transform must pickle; the record sampler pickles without its data. Both
are checked when the Loader is built (:func:`check_payload`: a TypeError naming what does
not pickle and the fix). Each worker first runs the main script again, as ``spawn`` does: a
script that builds its Loader outside ``if __name__ == "__main__":`` would build one in every
worker. Such a worker exits at once, quietly, and the Loader raises one
:class:`WorkerStartError` saying to add the guard; the pool and the shared batch ring are
released first, so nothing is left behind.

Determinism: the same ``make_sample`` with the same keys as the thread path, so the output
bytes are identical. Skipped samples are replaced in the loader's process (replacements need
the dataset). State: none. Memory: ``num_threads`` processes, each with its own decode buffers
and a mapping of the shared batch buffers (no copy).
"""

from __future__ import annotations

import multiprocessing
import pickle
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import shared_memory
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

import numpy as np

from shardfeed.errors import ShardfeedError
from shardfeed.pipeline.batching import BatchBuffer, BatchLayout
from shardfeed.pipeline.produce import SliceBuilder, in_place_keys
from shardfeed.pipeline.samplers import DATA_ERRORS, EpochContext, Sample, SampleKey
from shardfeed.transforms.arrays import opencv_on_callers
from shardfeed.transforms.wrap import DeclaredTransform, FunctionTransform

__all__ = ["ProcessWorkers", "WorkerStartError", "check_payload"]

_WORKER: dict[str, Any] = {}
WORKER_NAME = "shardfeed-worker"
_NO_GUARD_EXIT = 75  # a worker re-running a main script that builds a process Loader exits so
_FIX = "or use workers='threads'"


class WorkerStartError(ShardfeedError, RuntimeError):
    """The worker processes of ``workers="processes"`` could not start (the message says why)."""


def check_payload(source: Any, transform: Any) -> None:
    """TypeError unless ``source`` and ``transform`` pickle, naming what does not and the fix.

    Called when a Loader with ``workers="processes"`` is built. In a worker process that is
    still running the main script (a script without the ``__main__`` guard builds its
    Loader there too) it exits the worker instead: the Loader in the script's own process
    then reports it (see the module docstring).
    """
    process = multiprocessing.current_process()
    if process.name.startswith(WORKER_NAME) and getattr(process, "_inheriting", False):
        raise SystemExit(_NO_GUARD_EXIT)
    for part in _parts(transform):
        try:
            pickle.dumps(part)
        except Exception as exc:  # noqa: BLE001 - pickle raises PicklingError, TypeError, ...
            raise TypeError(
                f"workers='processes' sends the transform to worker processes by pickling it, "
                f"but {_describe(part)} cannot be pickled ({type(exc).__name__}: {exc}): "
                "define it as a function or class at the top level of a module (not a lambda, "
                f"a nested function or a class defined inside a function), {_FIX}"
            ) from None
    try:
        pickle.dumps(source)
    except Exception as exc:  # noqa: BLE001 - as above
        raise TypeError(
            f"workers='processes' sends the source to worker processes by pickling it, but "
            f"{type(source).__name__} cannot be pickled ({type(exc).__name__}: {exc}): make it "
            f"picklable (leave open files out in __getstate__), {_FIX}"
        ) from None


def _parts(transform: Any) -> list[Any]:
    """The transforms to try pickling, innermost first, so the error names the culprit."""
    if transform is None:
        return []
    parts: list[Any] = []
    # a function or an object wrapped once by transforms.base.adapt
    inner = transform.function if isinstance(transform, FunctionTransform) else (
        transform.inner if isinstance(transform, DeclaredTransform) else None)
    children = getattr(transform, "transforms", None)  # Compose
    if callable(inner):
        parts += _parts(inner)
    if isinstance(children, (list, tuple)):
        for child in children:
            parts += _parts(child)
    return [*parts, transform]


def _describe(part: Any) -> str:
    name = getattr(part, "__qualname__", None)
    if isinstance(name, str) and not isinstance(part, type):
        return f"the function {getattr(part, '__module__', '?')}.{name}"
    if isinstance(part, type):
        return f"the class {part.__module__}.{part.__qualname__}"
    cls = type(part)
    return f"the {cls.__module__}.{cls.__qualname__} object {part!r}"


class _WorkerContext(SpawnContext):
    """The ``spawn`` context, with named worker processes that it remembers (for exit codes)."""

    def __init__(self) -> None:
        self.started: list[SpawnProcess] = []

    def Process(self, *args: Any, **kwargs: Any) -> SpawnProcess:  # type: ignore[override]
        process = SpawnProcess(*args, **kwargs)
        process.name = f"{WORKER_NAME}-{len(self.started)}"
        self.started.append(process)
        return process


@dataclass(frozen=True, slots=True)
class _Item:
    row: int
    position: int
    record_ids: tuple[int, ...]
    records: list[Sample]


def _attach(name: str) -> shared_memory.SharedMemory:
    # Spawned workers share the loader's resource tracker, which already knows the block;
    # the loader's process unlinks it on close.
    return shared_memory.SharedMemory(name=name)


def _init_worker(payload: bytes, layout: BatchLayout, names: list[str]) -> None:
    opencv_on_callers()  # a spawned worker starts with OpenCV's pool on
    try:
        source, transform = pickle.loads(payload)
    except Exception as exc:  # noqa: BLE001 - e.g. a class defined under a __main__ guard
        _WORKER["error"] = "".join(traceback.format_exception_only(exc)).strip()
        return
    blocks = [_attach(name) for name in names]
    _WORKER.update(
        source=source, transform=transform, blocks=blocks,
        buffers=[BatchBuffer(layout, block.buf) for block in blocks],
        in_place=in_place_keys(source, transform, layout),
    )


def _ready() -> str | None:
    """None once the worker holds the source and transform; else why it could not load them."""
    error = _WORKER.get("error")
    return None if error is None else str(error)


def _make_rows(buffer_index: int, first_row: int, seed: int, epoch: int, items: list[_Item],
               skip: bool) -> tuple[dict[int, dict[str, Any]], list[int]]:
    if "error" in _WORKER:
        raise TypeError(_WORKER["error"])
    source = _WORKER["source"]
    transform = _WORKER["transform"]
    buffer: BatchBuffer = _WORKER["buffers"][buffer_index]
    in_place: tuple[str, ...] = _WORKER["in_place"]
    lists: dict[int, dict[str, Any]] = {}
    bad: list[int] = []
    for item in items:
        key = SampleKey(seed, epoch, item.position)
        row = first_row + item.row
        # The image is written straight into the shared batch row when the transform can.
        slots = {k: buffer.slot(k, row) for k in in_place} if in_place else None
        try:
            if slots:
                sample = source.make_sample(
                    key, item.record_ids, item.records, transform, out=slots
                )
            else:
                sample = source.make_sample(key, item.record_ids, item.records, transform)
        except DATA_ERRORS as exc:
            if skip:
                bad.append(item.row)
                continue
            exc.shardfeed_row = item.row  # type: ignore[attr-defined]
            raise
        except Exception as exc:
            exc.shardfeed_row = item.row  # type: ignore[attr-defined]
            raise
        buffer.write(row, sample, where=f"epoch position {item.position}", written=slots)
        lists[item.row] = {name: values[row] for name, values in buffer.lists.items()}
    return lists, bad


class ProcessWorkers:
    """A pool of worker processes writing samples into a shared batch ring."""

    def __init__(self, builder: SliceBuilder, layout: BatchLayout, names: list[str],
                 buffers: list[BatchBuffer], *, processes: int) -> None:
        self.builder = builder
        self.buffers = buffers
        payload = pickle.dumps((builder.sampler, builder.transform))
        self._context = _WorkerContext()
        self.pool = ProcessPoolExecutor(
            max_workers=processes,
            mp_context=self._context,
            initializer=_init_worker,
            initargs=(payload, layout, names),
        )
        self._start(processes)

    def _start(self, processes: int) -> None:
        """Start the workers and wait until each holds the source and transform."""
        try:
            waiting = [self.pool.submit(_ready) for _ in range(processes)]
            errors = [f.result() for f in waiting]
        except BrokenProcessPool:
            self.pool.shutdown(wait=True, cancel_futures=True)
            raise WorkerStartError(self._why_not_started()) from None
        except BaseException:
            self.pool.shutdown(wait=True, cancel_futures=True)
            raise
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            raise TypeError(
                f"a worker process could not load the transform or source ({error}): with "
                "workers='processes' they must be importable in a fresh process: define them "
                "at the top level of a module, not inside `if __name__ == \"__main__\":` or "
                f"a function, {_FIX}"
            )

    def _why_not_started(self) -> str:
        codes = []
        for process in self._context.started:
            process.join(timeout=10)
            codes.append(process.exitcode)
        if _NO_GUARD_EXIT in codes:
            script = getattr(sys.modules.get("__main__"), "__file__", None) or "the main script"
            return (
                f"the worker processes could not start: each worker starts with the 'spawn' "
                f"method and first runs {script} again, which builds a Loader with "
                "workers='processes' at its top level; put the script's work under "
                f"`if __name__ == \"__main__\":` (as for any multiprocessing program), {_FIX}"
            )
        return (
            f"the worker processes exited while starting (exit codes {codes}); their errors "
            f"are printed above; {_FIX}"
        )

    def build_slice(self, ctx: EpochContext, positions: np.ndarray, buffer: BatchBuffer,
                    first_row: int) -> int:
        """Like :meth:`SliceBuilder.build_slice`, with ``make_sample`` run in a worker process."""
        builder = self.builder
        plans, records, bad_records = builder.read_slice(ctx, positions)
        position_list = positions.tolist()
        items: list[_Item] = []
        replace: list[int] = []
        for row, (position, ids) in enumerate(zip(position_list, plans)):
            ids = tuple(int(i) for i in ids)
            if any(i in bad_records for i in ids):
                replace.append(row)
            else:
                items.append(_Item(row, position, ids, [records[i] for i in ids]))
        buffer_index = self.buffers.index(buffer)
        future = self.pool.submit(
            _make_rows, buffer_index, first_row, ctx.seed, ctx.epoch, items, builder.skip
        )
        try:
            lists, bad_rows = future.result()
        except Exception as exc:
            row_of_error: int | None = getattr(exc, "shardfeed_row", None)
            if row_of_error is not None:
                row = row_of_error
                replacement = builder.located(
                    exc, ctx.key(position_list[row]), plans[row], "transform (worker process)"
                )
                if replacement is not None:
                    raise replacement from exc
            raise
        for row, values in lists.items():
            for name, value in values.items():
                buffer.lists[name][first_row + row] = value
        skipped = 0
        for row in sorted([*replace, *bad_rows]):
            sample, bad, buffer.keys[first_row + row] = builder.replacement(
                ctx, position_list[row]
            )
            skipped += bad + 1
            buffer.write(first_row + row, sample,
                         where=builder.describe(position_list[row], plans[row]))
        return skipped

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
