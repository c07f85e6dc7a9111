"""A ``tf.data.Dataset`` from a Loader: ``shardfeed.tf.dataset(loader)``.

::

    ds = shardfeed.tf.dataset(loader)                  # {"image": uint8 (B,224,224,3), ...}
    model.fit(ds.map(lambda b: (b["image"], b["image/class/label"])), epochs=3)

The element spec is the loader's batch layout, learned before the first batch from the one
sample the loader builds to size its buffers (images, masks, windows of frames, padded boxes,
float label vectors: their dtype and row shape; the batch axis is fixed with ``drop_last``,
else ``None``). Lists of bytes or strings (file names) become ``tf.string``; lists of arrays
of varying length become ragged tensors. A loader with batch stages (which may change the
batch's keys) has its spec learned from one batch instead, its state kept.

Each iteration of the Dataset runs the loader's current epoch to its end (``for batch in
loader``), so iterating again gives the loader's next epoch; ``set_epoch``, shuffling,
threads and the memory bound are the loader's. Path of a batch::

    loader thread pool -> ring buffer (NumPy) -> tf.Tensor (no copy where NumPy's buffer is
    aligned, else the one copy) -> prefetch buffer (``prefetch`` batches) -> [device]

A tensor made without a copy holds the NumPy batch, so the loader never writes into that
memory while TensorFlow holds it: its ring grows once by the batches TensorFlow may hold
(``prefetch + 2``, see ``Loader.reserve_held_batches``) and builds in them again after.

Exact resume: :class:`LoaderState` is a ``tf.train.Checkpoint`` item that saves the loader's
state after the batches taken from the Dataset (not after those prefetched): the Dataset counts
each batch as the consumer takes it, after the prefetch buffer.

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


def _unwrap(loader: Any) -> Any:
    """The Loader under an adapter (batches are converted again here from NumPy)."""
    return loader.loader if isinstance(loader, AdaptedLoader) else loader


def _spec_of_value(name: str, value: Any, batch: int | None) -> tf.TypeSpec:
    """The spec of one batch column, from one sample's value (bytes/str/array/scalar)."""
    if isinstance(value, (bytes, str, np.bytes_, np.str_)):
        return tf.TensorSpec((batch,), tf.string, name=name)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return tf.RaggedTensorSpec((batch, None, *value.shape[1:]), tf.as_dtype(value.dtype))
    raise TypeError(
        f"feature {name!r} holds {type(value).__name__} values, which have no tf.data type: "
        "leave it out with features=[...] (the names to keep)"
    )


def _fields(loader: Any) -> list[tuple[str, Any, Any]]:
    """``(name, field, first sample value)`` of every batch key, from the loader's probe."""
    layout, sample = loader.batch_layout()
    return [(f.name, f, sample.get(f.name)) for f in layout.fields]


def _specs_from_layout(loader: Any) -> dict[str, tf.TypeSpec]:
    batch = loader.options.batch_size if loader.options.drop_last else None
    specs: dict[str, tf.TypeSpec] = {}
    for name, field, value in _fields(loader):
        if field.is_array:
            specs[name] = tf.TensorSpec((batch, *field.shape), tf.as_dtype(np.dtype(field.dtype)),
                                        name=name)
        else:
            specs[name] = _spec_of_value(name, value, batch)
    return specs


def _specs_from_batch(loader: Any) -> dict[str, tf.TypeSpec]:
    """The spec from one batch; the loader's state is put back."""
    saved = loader.state()
    batch = next(iter(loader))
    loader.restore(saved)
    size = loader.options.batch_size if loader.options.drop_last else None
    specs: dict[str, tf.TypeSpec] = {}
    for name, column in batch.items():
        if isinstance(column, np.ndarray):
            specs[name] = tf.TensorSpec((size, *column.shape[1:]), tf.as_dtype(column.dtype),
                                        name=name)
        elif isinstance(column, list) and column:
            specs[name] = _spec_of_value(name, column[0], size)
    return specs


def element_spec(loader: Any, *, features: Sequence[str] | None = None
                 ) -> dict[str, tf.TypeSpec]:
    """The spec of the loader's batches as a dict of ``tf.TensorSpec`` / ``RaggedTensorSpec``.

    Learned from the loader's batch layout (one sample built, no batch), or from one batch
    when the loader has batch stages. ``features`` keeps only those names, in that order.
    """
    loader = _unwrap(loader)
    if loader.batch_stages or not hasattr(loader, "batch_layout"):
        specs = _specs_from_batch(loader)
    else:
        specs = _specs_from_layout(loader)
    if features is None:
        return specs
    missing = [name for name in features if name not in specs]
    if missing:
        raise ValueError(f"features {missing} are not in the loader's batches {sorted(specs)}")
    return {name: specs[name] for name in features}


class _Stream:
    """The generator behind the Dataset, and the loader's state after each batch handed out.

    ``produced`` counts batches handed to tf.data, ``taken`` those the consumer took (after the
    prefetch buffer); ``history[k]`` is the loader's state after ``k`` batches. A pass that
    starts while batches were produced but never taken (a prefetch buffer dropped with its
    iterator) first puts the loader back to the state after the last batch taken.
    """

    def __init__(self, loader: Any, specs: Mapping[str, tf.TypeSpec]) -> None:
        self.loader = loader
        self.specs = dict(specs)
        self.produced = 0
        self.taken = 0
        self.history: dict[int, dict[str, Any]] = {0: loader.state()}
        self._lock = threading.Lock()  # the generator and the consumer run on two threads

    def state(self) -> dict[str, Any]:
        with self._lock:
            return self.history[self.taken]

    def restore(self, state: Mapping[str, Any]) -> None:
        self.loader.restore(state)
        with self._lock:
            self.produced = self.taken = 0
            self.history = {0: self.loader.state()}

    def take(self) -> np.int64:
        with self._lock:
            self.history.pop(self.taken, None)
            self.taken += 1
            return np.int64(self.taken)

    def _convert(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, spec in self.specs.items():
            value = batch[name]
            if isinstance(spec, tf.RaggedTensorSpec):
                rows = [np.asarray(v) for v in value]
                out[name] = tf.RaggedTensor.from_row_lengths(
                    np.concatenate(rows) if rows else np.zeros((0,), spec.dtype.as_numpy_dtype),
                    np.array([len(r) for r in rows], dtype=np.int64))
            elif isinstance(value, list):
                out[name] = np.array(value, dtype=object)
            else:
                out[name] = value
        return out

    def __call__(self) -> Iterator[dict[str, Any]]:
        if self.produced != self.taken:
            self.loader.restore(self.history[self.taken])
            self.produced = self.taken
        for batch in self.loader:
            converted = self._convert(batch)
            state = self.loader.state()
            with self._lock:
                self.produced += 1
                self.history[self.produced] = state
            yield converted


# the stream of each loader a Dataset was made from (for LoaderState)
_STREAMS: weakref.WeakKeyDictionary[Any, _Stream] = weakref.WeakKeyDictionary()


def dataset(loader: Any, *, features: Sequence[str] | None = None, prefetch: int = 2,
            device: str | None = None) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of the loader's batches (dicts of tensors; see the module docstring).

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
    # the prefetch buffer, the batch in the consumer's hands and the one on its way hold the
    # loader's memory (tensors made without a copy): the ring builds in them again later
    loader.reserve_held_batches(prefetch + 2)
    stream = _Stream(loader, specs)
    _STREAMS[loader] = stream
    ds = tf.data.Dataset.from_generator(stream, output_signature=specs)
    if prefetch:
        ds = ds.prefetch(prefetch)

    def counted(batch: dict[str, Any]) -> dict[str, Any]:
        # runs when the consumer takes the batch: after the prefetch buffer
        taken = tf.numpy_function(stream.take, [], tf.int64, stateful=True)
        with tf.control_dependencies([taken]):
            return {name: tf.identity(value) for name, value in batch.items()}

    ds = ds.map(counted)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # would take batches early
    options.experimental_optimization.map_parallelization = False
    # Nothing here is tuned (the prefetch depth is fixed, the map is serial); with autotuning
    # on, a third of the passes (train 224, 2 cores) ended 0.2-2.6 s after their last batch,
    # tf.data's iterator waiting in its teardown for the tuner; with it off, none did.
    options.autotune.enabled = False
    ds = ds.with_options(options)
    if device is not None:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device, buffer_size=1))
    return ds


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
