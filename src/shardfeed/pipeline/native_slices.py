"""A slice of small records built in one compiled call that holds no GIL.

On a node of many cores, light per-sample work (28×28 PNG or raw records) scales with threads
only as far as each slice leaves the GIL free. :class:`NativeSlices` builds such a slice in
one call of the compiled part (``pipeline/_slice.c``): the records are read from the mapped
shards, their framing and CRCs checked, their ``tf.train.Example`` parsed, the image decoded
(the plainest 8-bit PNGs, as ``transforms/decode/_png.c`` decodes them) or its raw pixels
copied, and every numeric feature written into its batch rows, all without the GIL; only the
bytes features (e.g. ``image/format``) are made into objects after it, with the GIL.

It applies to a :class:`~shardfeed.pipeline.samplers.RecordSampler` over local shards of a
:class:`~shardfeed.dataset.Dataset` read with the compiled part, and a plain
:class:`~shardfeed.transforms.DecodeImage` (uint8, no mask, stored bytes dropped) whose image
fits the batch rows as they are. Anything else, and any slice the call does not accept (a bad
CRC, another encoding or feature set, a PNG outside the plain kind, a raw image of another
shape), is built by the batch and sample paths of :class:`~.produce.SliceBuilder` as before,
which give the same bytes or name the record: so the bytes never depend on this path, and
the errors are those of the other paths.

Determinism: a pure function of the records. State: none (a plan made once per batch
layout). Memory: a parse table of the slice's records (a few dozen bytes each) and one
image's scanlines.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardfeed.dataset.dataset import Dataset, MappedShards
from shardfeed.format.native import compiled_module
from shardfeed.pipeline.batching import BatchBuffer, BatchLayout, Field
from shardfeed.pipeline.samplers import EpochContext, RecordSampler, Transform
from shardfeed.transforms.decode.ops import DecodeImage
from shardfeed.transforms.decode.raw_rows import shape_keys
from shardfeed.transforms.decode.sizes import pixels_reason

compiled = compiled_module("shardfeed.pipeline._slice")
"""The compiled slice (``_slice.c``); None where built without a C compiler or zlib."""

# actions of _slice.slice_rows, and the Example kinds of _wire.c
_NUMERIC, _BYTES, _PNG, _RAW = 1, 2, 3, 4
_KINDS = {np.dtype(np.float32): 1, np.dtype(np.int64): 2}
MAX_MISSES = 4
"""Slices the call may hand back (to the other paths) before it stops being tried, while it
has built fewer slices than it handed back (data it never accepts costs a few slices)."""


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the compiled call does with a layout's slices."""

    mapped: MappedShards  # every shard's map and offsets, its first records, the names
    keys: tuple[bytes, ...]
    count: int
    actions: tuple[tuple[int, int, int, int], ...]
    outs: tuple[str | None, ...]  # the batch array each feature is written into
    lists: tuple[tuple[int, str], ...]  # (feature number, list column) of bytes features


class NativeSlices:
    """Builds whole slices of one loader in the compiled call where its data allows.

    Thread-safe; shared by the loader's threads. Determinism, state, memory: see the module.
    """

    def __init__(self, source: RecordSampler, transform: DecodeImage) -> None:
        self._source = source
        self._transform = transform
        self._plan: tuple[BatchLayout, _Plan | None] | None = None
        self._lock = threading.Lock()
        self._built = 0
        self._missed = 0
        self.enabled = True

    @classmethod
    def of(cls, source: Any, transform: Transform | None) -> NativeSlices | None:
        """The native slices of ``source`` + ``transform``, or None where they never apply."""
        if (compiled is None or type(transform) is not DecodeImage
                or not isinstance(source, RecordSampler)):
            return None
        return cls(source, transform)

    def build(self, ctx: EpochContext, positions: np.ndarray, buffer: BatchBuffer,
              first_row: int) -> bool:
        """Write the samples of ``positions`` into rows ``first_row...`` of ``buffer``; False
        (rows unspecified) where this slice is for the other paths."""
        assert compiled is not None
        records = self._source.single_records(ctx, positions)
        if not len(records):
            return False
        ds: Any = self._source._ds()
        plan = self._plan_for(buffer.layout, ds, records)
        if plan is None:
            self.enabled = False
            return False
        if not plan.mapped.is_open():  # closed: the other paths say so
            return False
        arrays = buffer.arrays
        outs = tuple(None if name is None else arrays[name] for name in plan.outs)
        try:
            mapped = plan.mapped
            got = compiled.slice_rows(mapped.maps, mapped.offsets, mapped.starts, records,
                                      mapped.verify, plan.keys, plan.count, plan.actions, outs,
                                      first_row)
        except (ValueError, BufferError):  # a map closed under us: the other paths say so
            self.enabled = False
            return False
        if got is None:
            self._missed += 1  # a race loses a count at worst
            if self._missed >= MAX_MISSES and self._missed > self._built:
                self.enabled = False
            return False
        self._built += 1
        read, columns = got
        plan.mapped.count_read(read)
        rows = len(records)
        for j, name in plan.lists:
            buffer.lists[name][first_row : first_row + rows] = columns[j]
        return True

    def _plan_for(self, layout: BatchLayout, ds: Any, records: np.ndarray) -> _Plan | None:
        made = self._plan
        if made is not None and made[0] is layout:
            return made[1]
        with self._lock:
            plan = _plan(self._transform, layout, ds, records)
            self._plan = (layout, plan)
        return plan


def _plan(decoder: DecodeImage, layout: BatchLayout, ds: Any, records: np.ndarray
          ) -> _Plan | None:
    """The compiled call's plan for ``layout``, or None where the data or transform is not
    for it (see the module doc)."""
    # the Dataset's own compiled read (Dataset.read_columns) reads these maps too
    mapped = ds.mapped_shards(records) if isinstance(ds, Dataset) else None
    if mapped is None:
        return None
    names = list(mapped.names)
    present = dict.fromkeys(names)
    found = decoder.image_field.locate(present)
    if (found is None or decoder.keep_encoded or decoder.image_dtype != "uint8"
            or (decoder.mask is not False and decoder.mask_field.locate(present))):
        return None
    key, encoding = found
    fields = {f.name: f for f in layout.fields}
    image = fields.get("image")
    channels = 3 if decoder.channels == "rgb" else 1
    if (image is None or not image.is_array or image.squeeze or np.dtype(image.dtype) != np.uint8
            or len(image.shape) != 3 or image.shape[2] != channels
            or set(fields) != {n for n in names if n != key} | {"image"}):
        return None
    height, width = image.shape[0], image.shape[1]
    if pixels_reason(height, width, decoder.max_pixels, what="image") is not None:
        return None
    expect: dict[str, int] = {}
    if encoding == "raw":
        keys = shape_keys(decoder, present)
        if keys is None or np.dtype(decoder.image_field.dtype) != np.uint8:
            return None
        height_key, width_key, channels_key = keys
        expect = {height_key: height, width_key: width}
        if channels_key is not None:
            expect[channels_key] = channels
        image_action = (_RAW, 0, 0, -1)
    elif decoder.image_field.encoding == "auto":
        image_action = (_PNG, 0, 0, -1)
    else:
        return None
    actions: list[tuple[int, int, int, int]] = []
    outs: list[str | None] = []
    lists: list[tuple[int, str]] = []
    for j, name in enumerate(names):
        if name == key:
            actions.append(image_action)
            outs.append("image")
            continue
        action = _feature_action(fields[name], expect.get(name, -1))
        if action is None:
            return None
        actions.append(action)
        outs.append(name if action[0] == _NUMERIC else None)
        if action[0] == _BYTES:
            lists.append((j, name))
    try:
        encoded = tuple(name.encode() for name in names)
    except UnicodeEncodeError:
        return None
    return _Plan(mapped, encoded, len(names) if mapped.exact else -1, tuple(actions),
                 tuple(outs), tuple(lists))


def _feature_action(field: Field, expect: int) -> tuple[int, int, int, int] | None:
    """The action of a feature kept as it is: a numeric array column of exactly the stored
    kind (int64, float32), or a list column of one bytes value a record."""
    if not field.is_array:
        return None if expect >= 0 else (_BYTES, 0, 0, -1)
    kind = _KINDS.get(np.dtype(field.dtype))
    length = 1 if field.squeeze else (field.shape[0] if len(field.shape) == 1 else 0)
    if kind is None or length < 1 or (expect >= 0 and (kind != 2 or length != 1)):
        return None
    return (_NUMERIC, kind, length, expect)


__all__ = ["NativeSlices"]
