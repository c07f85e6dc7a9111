"""How ``shardfeed.tf.dataset`` hands a loader's batches to tf.data: the stream a
``numpy_function`` pulls blocks of batches from, the graph around it, and the count of the
batches the consumer took.

A Python call into tf.data costs ~120 us on 2 cores, a tf.data map of a few ops as much again
through its inter-op pool: a 28x28 batch of 16 takes ~200 us to build. So batches under
1 MiB go over in blocks (up to 16 batches, stacked: one copy, one call, one hand-over between
threads a block; ``unbatch`` splits them in the graph), and the maps here run their ops
inline (tf.data's own map with ``use_inter_op_parallelism=False``: ~3 us). A batch of 1 MiB
or more goes alone, without a copy.

Determinism: the loader's (blocks change nothing of what a batch holds or its order). State:
``Stream.history``, the loader's state after each batch not yet known to be taken.
Memory: one block (under 1 MiB a batch, 16 batches at most) beside the loader's ring.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow as tf


def text_column(name: str, spec: tf.TypeSpec, value: Any) -> np.ndarray:
    """A list column of bytes as the object array tf.data takes for ``tf.string``."""
    column = np.array(value, dtype=object)
    if column.shape[1:] != tuple(spec.shape[1:]):
        raise ValueError(f"feature {name!r}: a batch of shape {column.shape}, where the "
                         f"Dataset's spec is {tuple(spec.shape)}")
    return column


def block_size(specs: Mapping[str, tf.TypeSpec], batch_bytes: int) -> int:
    """Batches handed to tf.data a Python call: several small ones together (each call costs
    tens of microseconds, a 28x28 batch of 16 takes about 250 to build on 2 cores), one
    alone from 1 MiB on (copying it into a block would cost more than the call saves, and
    alone it goes without a copy). Ragged features: one (their rows are built in the graph)."""
    if any(isinstance(spec, tf.RaggedTensorSpec) for spec in specs.values()):
        return 1
    return max(1, min(_MAX_BLOCK, _BLOCK_BYTES // max(batch_bytes, 1)))


_BLOCK_BYTES = 1 << 20
_MAX_BLOCK = 16


class Stream:
    """The batches of the Dataset, fetched by tf.data a block at a time, and the loader's
    state after each batch taken.

    ``fetch(call)`` runs in tf.data (a ``numpy_function``): call 0 starts a pass, each call
    gives the next batches of the loader, stacked, with their numbers in the stream (a pass's
    first block is one batch, each next one twice the last, up to ``block``: the consumer's
    first batch of a pass waits for one batch, not for a block);
    ``StopIteration`` ends the pass where the loader's epoch ends (the loader goes on to its
    next epoch after the last batch of one). A map after the prefetch
    buffer stores the number of the batch the consumer takes in ``taken`` (a
    ``tf.Variable``: no Python runs there). ``history[k]`` is the loader's state after ``k``
    batches, kept for the batches between the two. A pass that starts while batches were
    produced but never taken (a prefetch buffer dropped with its iterator) first puts the
    loader back to the state after the last batch taken.
    """

    def __init__(self, loader: Any, specs: Mapping[str, tf.TypeSpec], *, keep: int,
                 block: int) -> None:
        self.loader = loader
        self.specs = dict(specs)
        self.block = block
        # batches that may sit between this and the consumer: besides ``keep``, the block
        # being split for it, the block in the prefetch buffer and the block being made
        self.keep = keep + 3 * block
        self.produced = 0
        self.history: dict[int, dict[str, Any]] = {0: loader.state()}
        self.taken = tf.Variable(0, dtype=tf.int64, trainable=False, name="batches_taken")
        self._batches: Iterator[dict[str, Any]] | None = None
        self._pending: dict[str, Any] | None = None  # a shorter last batch, for its own block
        self._size = 1  # batches the next block holds (up to ``block``)
        self._lock = threading.Lock()  # tf.data's threads and the consumer's

    def state(self) -> dict[str, Any]:
        taken = int(self.taken.numpy())
        with self._lock:
            if taken not in self.history:
                raise RuntimeError(f"the loader's state after batch {taken} of the stream is "
                                   f"no longer known (kept: {sorted(self.history)})")
            return self.history[taken]

    def restore(self, state: Mapping[str, Any]) -> None:
        self.loader.restore(state)
        with self._lock:
            self.produced = 0
            self.history = {0: self.loader.state()}
            self._batches = self._pending = None
        self.taken.assign(0)

    def _start_pass(self) -> None:
        taken = int(self.taken.numpy())
        if self.produced != taken:  # batches made for a pass whose consumer went away
            self.loader.restore(self.history[taken])
            self.produced = taken
            for number in [k for k in self.history if k > taken]:
                del self.history[number]
        self._pending = None
        self._batches = iter(self.loader)
        self._size = 1  # the pass's first block is one batch, the next ones twice as many

    def _next_batches(self) -> list[dict[str, Any]]:
        """Up to ``block`` batches of one row count (a shorter last batch waits for the next
        call), each with the loader's state after it recorded."""
        out: list[dict[str, Any]] = []
        assert self._batches is not None
        size, self._size = self._size, min(self.block, 2 * self._size)
        while len(out) < size:
            if self._pending is not None:
                batch, self._pending = self._pending, None
            else:
                try:
                    batch = next(self._batches)
                except StopIteration:
                    break
                self.produced += 1
                self.history[self.produced] = self.loader.state()
                self.history.pop(self.produced - self.keep, None)
            if out and rows_of(batch) != rows_of(out[0]):
                self._pending = batch
                break
            out.append(batch)
        return out

    def fetch(self, call: Any) -> list[Any]:
        """The next block: ``[numbers, *columns]`` (a leading block axis when ``block`` > 1)."""
        with self._lock:
            if int(call) == 0:
                self._start_pass()
            batches = self._next_batches() if self._batches is not None else []
            if not batches:  # the loader's epoch ended: so does the pass
                self._batches = None
                raise StopIteration
            last = self.produced - (1 if self._pending is not None else 0)
            numbers = np.arange(last - len(batches) + 1, last + 1, dtype=np.int64)
        if self.block == 1:
            return [numbers[0], *self._columns(batches[0])]
        return [numbers, *self._stacked(batches)]

    def _columns(self, batch: Mapping[str, Any]) -> list[Any]:
        out: list[Any] = []
        for name, spec in self.specs.items():
            value = batch[name]
            if isinstance(spec, tf.RaggedTensorSpec):
                kind = object if spec.dtype == tf.string else None
                # a record of one value may come as a scalar: a row of one
                rows = [np.atleast_1d(np.asarray(v, dtype=kind)) for v in value]
                out.append(np.concatenate(rows) if rows else
                           np.zeros((0, *spec.shape[2:]), spec.dtype.as_numpy_dtype))
                out.append(np.array([len(r) for r in rows], dtype=np.int64))
            elif isinstance(value, list):
                out.append(text_column(name, spec, value))
            else:
                out.append(value)
        return out

    def _stacked(self, batches: list[dict[str, Any]]) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for name, spec in self.specs.items():
            first = batches[0][name]
            if isinstance(first, list):
                out.append(np.stack([text_column(name, spec, b[name]) for b in batches]))
                continue
            block = np.empty((len(batches), *first.shape), first.dtype)
            for k, batch in enumerate(batches):
                block[k] = batch[name]
            out.append(block)
        return out


def rows_of(batch: Mapping[str, Any]) -> int:
    for value in batch.values():
        return len(value)
    return 0


def synchronous_map(ds: tf.data.Dataset, function: Any, *, preserve_cardinality: bool = True
                     ) -> tf.data.Dataset:
    """``ds.map(function)`` with the function's ops run inline, on the calling thread: a map
    of a few ops cost ~120 us an element on 2 cores through tf.data's inter-op pool, ~3 us
    inline. tf.data's own class, as ``Dataset.map`` makes it, with the options it hides."""
    try:
        from tensorflow.python.data.ops import map_op
    except ImportError:  # pragma: no cover - another TensorFlow layout: the public map
        return ds.map(function)
    made: tf.data.Dataset = map_op._MapDataset(  # the option is not public
        ds, function, use_inter_op_parallelism=False,
        preserve_cardinality=preserve_cardinality)
    return made


def with_cardinality(ds: tf.data.Dataset, batches: int) -> tf.data.Dataset:
    """``ds`` with the cardinality ``batches`` (Keras reads it as the epoch's steps), still
    ending where ``ds`` ends (a pass over the rest of an epoch is shorter): ``ds``, then an
    empty Dataset tf.data takes for endless, zipped with ``range(batches)``."""
    endless = ds.concatenate(endless_nothing(ds.element_spec))
    zipped = tf.data.Dataset.zip(endless, tf.data.Dataset.range(batches))
    return synchronous_map(zipped, lambda element, _: element)


def batches_of(stream: Stream, specs: Mapping[str, tf.TypeSpec], prefetch: int
             ) -> tf.data.Dataset:
    """One pass of the stream: ``(number, *columns)`` a batch; it ends with the loader's
    epoch. Blocks of several batches are prefetched as blocks (one hand-over between threads
    a block)."""
    types: list[tf.DType] = [tf.int64]
    shapes: list[tuple[int | None, ...]] = [()]
    for spec in specs.values():
        if isinstance(spec, tf.RaggedTensorSpec):
            types += [spec.dtype, tf.int64]
            shapes += [(None, *spec.shape[2:]), (None,)]
        else:
            types.append(spec.dtype)
            shapes.append(tuple(spec.shape))
    lead: tuple[int | None, ...] = (None,) if stream.block > 1 else ()

    def fetch(call: tf.Tensor) -> tuple[tf.Tensor, ...]:
        made = tf.numpy_function(stream.fetch, [call], types, stateful=True)
        for tensor, shape in zip(made, shapes):
            tensor.set_shape((*lead, *shape))
        return tuple(made)

    calls = tf.data.Dataset.range(1 << 62)  # 0 starts the pass
    blocks = synchronous_map(calls, fetch, preserve_cardinality=False)
    if stream.block == 1:
        return blocks
    if prefetch:
        blocks = blocks.prefetch(1)
    return blocks.unbatch()


def endless_nothing(spec: Any) -> tf.data.Dataset:
    """A Dataset of ``spec``'s elements that gives none, of infinite cardinality to tf.data
    (a Dataset of unknown length, repeated: ``repeat`` ends when a round gives nothing)."""
    def empty(part: tf.TypeSpec) -> Any:
        if isinstance(part, tf.RaggedTensorSpec):  # (B, None, ...) rows of no values
            inner = [0 if d is None else d for d in part.shape[2:]]
            return tf.RaggedTensor.from_row_lengths(
                tf.zeros([0, *inner], part.dtype), tf.zeros([0], part.row_splits_dtype),
                validate=False)
        return tf.zeros([0 if d is None else d for d in part.shape], part.dtype)

    def zeros(_: tf.Tensor) -> Any:
        return tf.nest.map_structure(empty, spec)

    nothing = synchronous_map(tf.data.Dataset.range(0), zeros, preserve_cardinality=False)
    return nothing.repeat()


def counted_map(stream: Stream, specs: Mapping[str, tf.TypeSpec]) -> Any:
    """The map that runs when the consumer takes a batch (after the prefetch buffer): the
    batch's number into ``stream.taken``, ragged features rebuilt, the dict of the batch."""
    taken = stream.taken
    items = list(specs.items())

    def counted(*element: tf.Tensor) -> dict[str, Any]:
        taken.assign(element[0])
        out: dict[str, Any] = {}
        columns = iter(element[1:])
        for name, spec in items:
            if isinstance(spec, tf.RaggedTensorSpec):
                values, lengths = next(columns), next(columns)
                # lengths made here sum to the values: no check (its assert ops cannot run
                # in the inline executor)
                out[name] = tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)
            else:
                out[name] = next(columns)
        return out

    return counted
