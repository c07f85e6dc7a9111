"""Process workers: run ``make_sample`` (decode + transform) in other processes.

For transforms written in Python that hold the GIL. The Loader's threads still plan and read
(one coalesced read per slice, as with threads); each thread then hands its slice's records to
a worker process, which builds the samples and writes their array columns straight into the
batch buffer in shared memory (``multiprocessing.shared_memory``). Only the list columns
(bytes, strings) and errors travel back through a pipe.

Processes start with the ``spawn`` method (safe with threads; no inherited locks), so the
source and the transform must pickle; the record source pickles without its dataset.

Determinism: the same ``make_sample`` with the same keys as the thread path, so the output
bytes are identical. Skipped samples are replaced in the loader's process (replacements need
the dataset). State: none. Memory: ``num_threads`` processes, each with its own decode buffers
and a mapping of the shared batch buffers (no copy).
"""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from shardfeed.pipeline.batching import BatchBuffer, BatchLayout
from shardfeed.pipeline.produce import DATA_ERRORS, SliceBuilder, in_place_keys
from shardfeed.pipeline.source import EpochContext, Sample, SampleKey

_WORKER: dict[str, Any] = {}


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
    source, transform = pickle.loads(payload)
    blocks = [_attach(name) for name in names]
    _WORKER.update(
        source=source, transform=transform, blocks=blocks,
        buffers=[BatchBuffer(layout, block.buf) for block in blocks],
        in_place=in_place_keys(source, transform, layout),
    )


def _make_rows(buffer_index: int, first_row: int, seed: int, epoch: int, items: list[_Item],
               skip: bool) -> tuple[dict[int, dict[str, Any]], list[int]]:
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
        payload = pickle.dumps((builder.source, builder.transform))
        self.pool = ProcessPoolExecutor(
            max_workers=processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(payload, layout, names),
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
            sample, bad = builder.replacement(ctx, position_list[row])
            skipped += bad + 1
            buffer.write(first_row + row, sample,
                         where=builder.describe(position_list[row], plans[row]))
        return skipped

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
