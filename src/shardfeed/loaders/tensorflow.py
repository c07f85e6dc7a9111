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

How the batches reach tf.data (blocks of small batches, maps run inline, a big batch without
a copy): :mod:`shardfeed.loaders.tf_stream`. A tensor made without a copy holds the NumPy
batch, so the loader never writes into that memory while TensorFlow holds it: its ring grows
once by the batches TensorFlow may hold (``prefetch + 2``, see
``Loader.reserve_held_batches``) and builds in them again after.

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
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from shardfeed.loaders.numpy import AdaptedLoader
from shardfeed.loaders.tf_stream import (
    Stream,
    batches_of,
    block_size,
    counted_map,
    synchronous_map,
    with_cardinality,
)
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


# the stream of each loader a Dataset was made from (for LoaderState)
_STREAMS: weakref.WeakKeyDictionary[Any, Stream] = weakref.WeakKeyDictionary()


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
    block = block_size(specs, batch_bytes)
    # one batch a call is handed over without a copy: the prefetch buffer, the batch in the
    # consumer's hands and the one on its way hold the loader's memory, and its ring builds
    # in them again later
    loader.reserve_held_batches(prefetch + 2)
    stream = Stream(loader, specs, keep=prefetch + 8, block=block)
    _STREAMS[loader] = stream
    ds = batches_of(stream, specs, prefetch)
    if prefetch and block == 1:
        ds = ds.prefetch(prefetch)
    ds = synchronous_map(ds, counted_map(stream, specs))
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
    return with_cardinality(ds, len(loader))


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
