"""A ``tf.data.Dataset`` from a Loader: ``shardfeed.tf.dataset(loader)``.

::

    ds = shardfeed.tf.dataset(loader)                  # {"image": uint8 (B,224,224,3), ...}
    model.fit(ds.map(lambda b: (b["image"], b["image/class/label"])), epochs=3)

The element spec is the loader's batch layout, learned before the first batch from the one
sample the loader builds to size its buffers (images, masks, windows of frames, padded boxes,
float label vectors: their dtype and row shape; the batch axis is fixed with ``drop_last``,
else ``None``). Bytes or strings (file names) become ``tf.string``: (B,), or (B, k) for the
k frames of a Windows sample; lists of other lengths and arrays of varying length become
ragged tensors. Only the kept ``features`` need a tf.data type. A loader with batch stages
(which may change the batch's keys) has its spec learned from one batch instead, its state
kept.

Each iteration of the Dataset runs the loader's current epoch to its end (``for batch in
loader``), so iterating again gives the loader's next epoch; ``set_epoch``, shuffling,
threads and the memory bound are the loader's. The Dataset's cardinality is ``len(loader)``
(Keras reads it as the epoch's steps); a pass that starts in the middle of an epoch (after a
restore) is what is left of that epoch, so Keras's ``fit(initial_epoch=e)`` after a restore
trains exactly the batches an uninterrupted run trains. Path of a batch::

    loader thread pool -> ring buffer (NumPy) -> one Python call (numpy_function) hands
    tf.data a block of batches -> prefetch buffer -> the counting map -> [device]

A Python call into tf.data costs ~120 us on 2 cores, a tf.data map of a few ops as much
again through its inter-op pool: a 28x28 batch of 16 takes ~200 us to build. So batches
under 1 MiB go over in blocks (up to 16 batches, stacked: one copy, one call, one hand-over
between threads a block; ``unbatch`` splits them in the graph), and the maps here run their
ops inline (tf.data's own map with ``use_inter_op_parallelism=False``: ~3 us). A batch of
1 MiB or more goes alone, without a copy: the tensor holds the NumPy batch, so the loader
never writes into that memory while TensorFlow holds it: its ring grows once by the batches
TensorFlow may hold (``prefetch + 2``, see ``Loader.reserve_held_batches``) and builds in
them again after.

Exact resume: :class:`LoaderState` is a ``tf.train.Checkpoint`` item that saves the loader's
state after the batches taken from the Dataset (not after those prefetched): each batch
carries its number in the stream, stored in a ``tf.Variable`` by a map after the prefetch
buffer, when the consumer takes it (no Python runs there).

tf.data's autotuning is off for the Dataset (its iterator's teardown waited for the tuner at
the end of a third of the epochs): ``map(..., num_parallel_calls=tf.data.AUTOTUNE)`` chained
onto it gets a fixed parallelism; a ``with_options`` that turns autotuning on again has it
tuned, and the wait back.

Determinism: the loader's. State: the loader's (:class:`LoaderState`). Memory: the loader's
bound, which counts the ``prefetch + 2`` batches TensorFlow may hold (with
``workers="processes"`` those batches are copies, TensorFlow's memory).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from shardfeed.loaders.numpy import AdaptedLoader
from shardfeed.pipeline.windows import Windows


def _unwrap(loader: Any) -> Any:
    """The Loader under an adapter (batches are converted again here from NumPy)."""
    return loader.loader if isinstance(loader, AdaptedLoader) else loader


def _is_text(value: Any) -> bool:
    return isinstance(value, (bytes, str, np.bytes_, np.str_))


def _spec_of_value(name: str, value: Any, batch: int | None,
                   frames: int | None) -> tf.TypeSpec:
    """The spec of one batch column, from one sample's value (bytes/str/list/array/scalar).

    ``frames``: the length of every per-frame list of a Windows sampler (None otherwise): a
    list of ``frames`` bytes a sample is a ``tf.string`` of shape (B, frames); lists of other
    lengths are ragged.
    """
    if _is_text(value):
        return tf.TensorSpec((batch,), tf.string, name=name)
    if isinstance(value, (list, tuple)) and all(_is_text(v) for v in value):
        if frames is not None and len(value) == frames:
            return tf.TensorSpec((batch, frames), tf.string, name=name)
        return tf.RaggedTensorSpec((batch, None), tf.string)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return tf.RaggedTensorSpec((batch, None, *value.shape[1:]), tf.as_dtype(value.dtype))
    raise TypeError(
        f"feature {name!r} holds {type(value).__name__} values, which have no tf.data type: "
        "leave it out with features=[...] (the names to keep)"
    )


def _window_length(loader: Any) -> int | None:
    """Frames a sample of a Windows sampler holds (its per-frame lists have that length)."""
    sampler = getattr(loader, "sampler", None)
    return int(sampler.options.length) if isinstance(sampler, Windows) else None


def _kept(names: Sequence[str], features: Sequence[str] | None) -> list[str]:
    """``features`` in their order, checked against the batch keys ``names``."""
    if features is None:
        return list(names)
    missing = [name for name in features if name not in names]
    if missing:
        raise ValueError(f"features {missing} are not in the loader's batches {sorted(names)}")
    return list(features)


def _specs_from_layout(loader: Any, features: Sequence[str] | None) -> dict[str, tf.TypeSpec]:
    batch = loader.options.batch_size if loader.options.drop_last else None
    frames = _window_length(loader)
    layout, sample = loader.batch_layout()
    fields = {f.name: f for f in layout.fields}
    specs: dict[str, tf.TypeSpec] = {}
    for name in _kept(list(fields), features):  # only the kept ones need a tf.data type
        field = fields[name]
        if field.is_array:
            specs[name] = tf.TensorSpec((batch, *field.shape), tf.as_dtype(np.dtype(field.dtype)),
                                        name=name)
        else:
            specs[name] = _spec_of_value(name, sample.get(name), batch, frames)
    return specs


def _specs_from_batch(loader: Any, features: Sequence[str] | None) -> dict[str, tf.TypeSpec]:
    """The spec from one batch; the loader's state is put back."""
    saved = loader.state()
    batch = next(iter(loader))
    loader.restore(saved)
    size = loader.options.batch_size if loader.options.drop_last else None
    frames = _window_length(loader)
    specs: dict[str, tf.TypeSpec] = {}
    for name in _kept(list(batch), features):
        column = batch[name]
        if isinstance(column, np.ndarray):
            specs[name] = tf.TensorSpec((size, *column.shape[1:]), tf.as_dtype(column.dtype),
                                        name=name)
        elif isinstance(column, list) and column:
            specs[name] = _spec_of_value(name, column[0], size, frames)
    return specs


def element_spec(loader: Any, *, features: Sequence[str] | None = None
                 ) -> dict[str, tf.TypeSpec]:
    """The spec of the loader's batches as a dict of ``tf.TensorSpec`` / ``RaggedTensorSpec``.

    Learned from the loader's batch layout (one sample built, no batch), or from one batch
    when the loader has batch stages. ``features`` keeps only those names, in that order (a
    feature left out needs no tf.data type).

    Raises:
        ValueError: ``features`` names a key the batches do not have.
        TypeError: a kept feature has no tf.data type.
    """
    loader = _unwrap(loader)
    if loader.batch_stages or not hasattr(loader, "batch_layout"):
        return _specs_from_batch(loader, features)
    return _specs_from_layout(loader, features)


def _text_column(name: str, spec: tf.TypeSpec, value: Any) -> np.ndarray:
    """A list column of bytes as the object array tf.data takes for ``tf.string``."""
    column = np.array(value, dtype=object)
    if column.shape[1:] != tuple(spec.shape[1:]):
        raise ValueError(f"feature {name!r}: a batch of shape {column.shape}, where the "
                         f"Dataset's spec is {tuple(spec.shape)}")
    return column


def _block_size(specs: Mapping[str, tf.TypeSpec], batch_bytes: int) -> int:
    """Batches handed to tf.data a Python call: several small ones together (each call costs
    tens of microseconds, a 28x28 batch of 16 takes about 250 to build on 2 cores), one
    alone from 1 MiB on (copying it into a block would cost more than the call saves, and
    alone it goes without a copy). Ragged features: one (their rows are built in the graph)."""
    if any(isinstance(spec, tf.RaggedTensorSpec) for spec in specs.values()):
        return 1
    return max(1, min(_MAX_BLOCK, _BLOCK_BYTES // max(batch_bytes, 1)))


_BLOCK_BYTES = 1 << 20
_MAX_BLOCK = 16


class _Stream:
    """The batches of the Dataset, fetched by tf.data a block at a time, and the loader's
    state after each batch taken.

    ``fetch(call)`` runs in tf.data (a ``numpy_function``): call 0 starts a pass, each call
    gives the next ``block`` batches of the loader, stacked, with their numbers in the stream;
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
        self.keep = keep + block  # batches that may sit between this and the consumer
        self.produced = 0
        self.history: dict[int, dict[str, Any]] = {0: loader.state()}
        self.taken = tf.Variable(0, dtype=tf.int64, trainable=False, name="batches_taken")
        self._batches: Iterator[dict[str, Any]] | None = None
        self._pending: dict[str, Any] | None = None  # a shorter last batch, for its own block
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

    def _next_batches(self) -> list[dict[str, Any]]:
        """Up to ``block`` batches of one row count (a shorter last batch waits for the next
        call), each with the loader's state after it recorded."""
        out: list[dict[str, Any]] = []
        assert self._batches is not None
        while len(out) < self.block:
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
            if out and _rows(batch) != _rows(out[0]):
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
                out.append(_text_column(name, spec, value))
            else:
                out.append(value)
        return out

    def _stacked(self, batches: list[dict[str, Any]]) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for name, spec in self.specs.items():
            first = batches[0][name]
            if isinstance(first, list):
                out.append(np.stack([_text_column(name, spec, b[name]) for b in batches]))
                continue
            block = np.empty((len(batches), *first.shape), first.dtype)
            for k, batch in enumerate(batches):
                block[k] = batch[name]
            out.append(block)
        return out


def _rows(batch: Mapping[str, Any]) -> int:
    for value in batch.values():
        return len(value)
    return 0


def _synchronous_map(ds: tf.data.Dataset, function: Any, *, preserve_cardinality: bool = True
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


# the stream of each loader a Dataset was made from (for LoaderState)
_STREAMS: weakref.WeakKeyDictionary[Any, _Stream] = weakref.WeakKeyDictionary()


def dataset(loader: Any, *, features: Sequence[str] | None = None, prefetch: int = 2,
            device: str | None = None) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of the loader's batches (dicts of tensors; see the module docstring).

    Its cardinality is the loader's batches an epoch (``len(loader)``), so Keras knows the
    epoch's steps; a pass that starts in the middle of the loader's epoch (after a restore)
    ends with that epoch, early.

    Args:
        loader: a :class:`shardfeed.Loader` (or an adapter of one).
        features: the batch keys to keep (default: all of them).
        prefetch: batches tf.data holds ready ahead of the consumer (0: none; the loader
            prefetches its own ``prefetch_batches`` anyway).
        device: e.g. ``"/gpu:0"``: batches are prefetched into that device's memory
            (``tf.data.experimental.prefetch_to_device``); None leaves them on the host.

    Raises:
        ValueError: ``prefetch`` < 0, or ``features`` names a key the batches do not have.
        TypeError: a kept feature has no tf.data type (leave it out with ``features``).
    """
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be an int >= 0 (batches), got {prefetch!r}")
    loader = _unwrap(loader)
    specs = element_spec(loader, features=features)
    batch_bytes = loader.batch_layout()[0].batch_bytes() if hasattr(loader, "batch_layout") \
        and not loader.batch_stages else 1 << 30
    block = _block_size(specs, batch_bytes)
    # one batch a call is handed over without a copy: the prefetch buffer, the batch in the
    # consumer's hands and the one on its way hold the loader's memory, and its ring builds
    # in them again later
    loader.reserve_held_batches(prefetch + 2)
    stream = _Stream(loader, specs, keep=prefetch + 8, block=block)
    _STREAMS[loader] = stream
    ds = _batches(stream, specs, prefetch)
    if prefetch and block == 1:
        ds = ds.prefetch(prefetch)
    ds = _synchronous_map(ds, _counted(stream, specs))
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # would take batches early
    options.experimental_optimization.map_parallelization = False
    # Nothing here is tuned (the prefetch depth is fixed, the maps are serial); with autotuning
    # on, a third of the passes (train 224, 2 cores) ended 0.2-2.6 s after their last batch,
    # tf.data's iterator waiting in its teardown for the tuner; with it off, none did.
    options.autotune.enabled = False
    ds = ds.with_options(options)
    if device is not None:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device, buffer_size=1))
    return _with_cardinality(ds, len(loader))


def _with_cardinality(ds: tf.data.Dataset, batches: int) -> tf.data.Dataset:
    """``ds`` with the cardinality ``batches`` (Keras reads it as the epoch's steps), still
    ending where ``ds`` ends (a pass over the rest of an epoch is shorter): ``ds``, then an
    empty Dataset tf.data takes for endless, zipped with ``range(batches)``."""
    endless = ds.concatenate(_endless_nothing(ds.element_spec))
    zipped = tf.data.Dataset.zip(endless, tf.data.Dataset.range(batches))
    return _synchronous_map(zipped, lambda element, _: element)


def _batches(stream: _Stream, specs: Mapping[str, tf.TypeSpec], prefetch: int
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
    blocks = _synchronous_map(calls, fetch, preserve_cardinality=False)
    if stream.block == 1:
        return blocks
    if prefetch:
        blocks = blocks.prefetch(1)
    return blocks.unbatch()


def _endless_nothing(spec: Any) -> tf.data.Dataset:
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

    nothing = _synchronous_map(tf.data.Dataset.range(0), zeros, preserve_cardinality=False)
    return nothing.repeat()


def _counted(stream: _Stream, specs: Mapping[str, tf.TypeSpec]) -> Any:
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


class LoaderState(tf.train.experimental.PythonState):  # type: ignore[misc]
    """The loader's state as a ``tf.train.Checkpoint`` item (JSON), for exact resume::

        ckpt = tf.train.Checkpoint(model=model, optimizer=opt, data=shardfeed.tf.LoaderState(loader))
        ckpt.restore(tf.train.latest_checkpoint(folder))   # before iterating the Dataset

    Saved: the state after the batches the consumer took from ``shardfeed.tf.dataset(loader)``
    (the loader's own ``state()`` when no Dataset was made from it). Restored: the loader
    continues that stream (``StateError`` for a state of another loader).
    """

    def __init__(self, loader: Any) -> None:
        self.loader = _unwrap(loader)

    def state(self) -> dict[str, Any]:
        """The state a checkpoint saved now would hold."""
        stream = _STREAMS.get(self.loader)
        state: dict[str, Any] = stream.state() if stream is not None else self.loader.state()
        return state

    def serialize(self) -> str:
        return json.dumps(self.state(), sort_keys=True)

    def deserialize(self, string_value: Any) -> None:
        text = string_value.decode() if isinstance(string_value, bytes) else str(string_value)
        state = json.loads(text)
        stream = _STREAMS.get(self.loader)
        if stream is not None:
            stream.restore(state)
        else:
            self.loader.restore(state)


__all__ = ["LoaderState", "dataset", "element_spec"]
