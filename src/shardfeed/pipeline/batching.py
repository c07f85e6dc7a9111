"""Batch layout and the reusable batch buffers samples are written into.

The layout is learned once from the first sample (or given): every numeric value becomes a
column of a preallocated array with one row per sample, everything else (bytes, strings,
lists, ragged arrays) a Python list::

    sample                                  batch (B samples)
    "image": uint8 (224, 224, 3)        ->  uint8 (B, 224, 224, 3)
    "image/class/label": int64 (1,)     ->  int64 (B,)          stored length 1: squeezed
    "labels": float32 (23,)             ->  float32 (B, 23)
    "image/filename": b"a.jpg"          ->  [b"a.jpg", ...]     list of B values
    "boxes": int64 (varies)             ->  [array, ...]        schema says the length varies

Determinism: a pure reshaping; row r of the batch is sample r. State: none. Memory: the
buffers a caller allocates (:meth:`BatchLayout.batch_bytes` each).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from shardfeed.errors import SchemaError

_ALIGN = 64


@dataclass(frozen=True, slots=True)
class Field:
    """One key of a batch: an array column (``shape`` is a row's shape) or a list."""

    name: str
    is_array: bool
    shape: tuple[int, ...] = ()
    dtype: str = ""
    squeeze: bool = False  # the sample holds shape (1,), the batch column is (B,)

    def row_bytes(self) -> int:
        if not self.is_array:
            return 0
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """The keys of every batch, in sample order, and how each is stored."""

    fields: tuple[Field, ...]
    batch_size: int

    @classmethod
    def infer(
        cls, sample: Mapping[str, Any], *, batch_size: int,
        lengths: Mapping[str, int | None] | None = None,
    ) -> BatchLayout:
        """Learn the layout from one sample; ``lengths`` marks stored features of varying length."""
        lengths = lengths or {}
        fields = []
        for name, value in sample.items():
            fields.append(_infer_field(name, value, ragged=name in lengths and lengths[name] is None))
        return cls(fields=tuple(fields), batch_size=batch_size)

    def batch_bytes(self) -> int:
        """Bytes of the array columns of one full batch (lists are not counted)."""
        return self.batch_size * sum(f.row_bytes() for f in self.fields)

    def offsets(self) -> tuple[list[int], int]:
        """Byte offset of each array column in one contiguous block, and the block size."""
        offsets = []
        position = 0
        for f in self.fields:
            offsets.append(position)
            if f.is_array:
                position += -(-self.batch_size * f.row_bytes() // _ALIGN) * _ALIGN
        return offsets, max(position, _ALIGN)


def _infer_field(name: str, value: Any, *, ragged: bool) -> Field:
    if isinstance(value, (bool, int, float, np.generic)) and not isinstance(
        value, (np.str_, np.bytes_, np.void)
    ):
        dtype = np.asarray(value).dtype
        return Field(name, True, (), dtype.str)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufc" and not ragged:
        if value.ndim == 1 and value.shape[0] == 1:
            return Field(name, True, (), value.dtype.str, squeeze=True)
        return Field(name, True, tuple(value.shape), value.dtype.str)
    return Field(name, False)


class BatchBuffer:
    """One batch's array columns (views into one block of memory) plus its list columns.

    Rows are written by several threads at once, each its own rows; lists are filled by index.
    """

    def __init__(self, layout: BatchLayout, block: memoryview | None = None) -> None:
        self.layout = layout
        offsets, size = layout.offsets()
        if block is None:
            self._raw = np.empty(size, dtype=np.uint8)
        else:
            self._raw = np.frombuffer(block, dtype=np.uint8, count=size)
        self.arrays: dict[str, np.ndarray] = {}
        for f, offset in zip(layout.fields, offsets):
            if f.is_array:
                count = layout.batch_size * int(np.prod(f.shape, dtype=np.int64))
                column = np.frombuffer(
                    self._raw, dtype=np.dtype(f.dtype), count=count, offset=offset
                )
                self.arrays[f.name] = column.reshape((layout.batch_size, *f.shape))
        # Per field: its column (None for lists), the shape and dtype a sample's value has,
        # and how a value of exactly that shape and dtype is stored (see _store_mode).
        self._plan: list[
            tuple[Field, str, np.ndarray | None, tuple[int, ...], np.dtype[Any], int]
        ] = [
            (f, f.name, self.arrays.get(f.name), (1,) if f.squeeze else f.shape,
             np.dtype(f.dtype) if f.is_array else np.dtype(np.uint8), _store_mode(f))
            for f in layout.fields
        ]
        self._names = frozenset(f.name for f in layout.fields)
        self.lists: dict[str, list[Any]] = {}
        self.reset_lists()

    def reset_lists(self) -> None:
        self.lists = {
            f.name: [None] * self.layout.batch_size for f in self.layout.fields if not f.is_array
        }

    def slot(self, name: str, row: int) -> np.ndarray:
        """Row ``row`` of array column ``name``: a view a transform may write the value into
        (``out=``); :meth:`write` then skips that key when the sample holds this very view."""
        view: np.ndarray = self.arrays[name][row]
        return view

    def write(
        self, row: int, sample: Mapping[str, Any], *, where: str | Callable[[], str],
        written: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Store ``sample`` as row ``row``; SchemaError if it does not fit the layout.

        ``where`` names the sample in that error (a callable is only called then: building
        the text costs more than writing a row). ``written``: slots from :meth:`slot` that the
        transform was handed; a key whose value *is* its slot is already in place.
        """
        if sample.keys() != self._names:
            expected = [f.name for f in self.layout.fields]
            raise SchemaError(
                f"sample {_where(where)} has keys {sorted(sample)}, but the batch holds "
                f"{sorted(expected)}: every sample must have the same keys; make the transform "
                "return the same keys for every record"
            )
        for f, name, column, shape, dtype, mode in self._plan:
            value = sample[name]
            if column is None:
                self.lists[name][row] = value
                continue
            if written is not None and value is written.get(name):
                continue
            if type(value) is np.ndarray and value.shape == shape and value.dtype == dtype:
                # the common case: no checks
                if mode == _WHOLE:
                    column[row] = value
                elif mode == _INTEGER_SCALAR:
                    column[row] = value.item()  # exact for integers, half the cost of value[0]
                else:
                    column[row] = value[0]
                continue
            array = np.asarray(value)
            shape = (1,) if f.squeeze else f.shape
            if array.shape != shape or not np.can_cast(array.dtype, f.dtype, "same_kind"):
                raise SchemaError(
                    f"feature {f.name!r} of sample {_where(where)} is {array.dtype} "
                    f"{array.shape}, but the batch holds {np.dtype(f.dtype)} {shape} (learned "
                    "from the first sample): batched arrays need one shape; resize in the "
                    "transform (e.g. presets.train(size=...)), or use transform=None to get "
                    "encoded bytes"
                )
            self.arrays[f.name][row] = array[0] if f.squeeze else array

    def take(self, count: int, *, copy: bool) -> dict[str, Any]:
        """The batch of the first ``count`` rows, as a dict in the layout's key order."""
        batch: dict[str, Any] = {}
        for f in self.layout.fields:
            if f.is_array:
                column = self.arrays[f.name]
                if count < self.layout.batch_size:
                    column = column[:count]
                batch[f.name] = column.copy() if copy else column
            else:
                batch[f.name] = self.lists[f.name][:count]
        return batch


_WHOLE, _INTEGER_SCALAR, _SCALAR = 0, 1, 2


def _store_mode(f: Field) -> int:
    """How :meth:`BatchBuffer.write` stores a value of the field's own shape and dtype."""
    if not f.squeeze:
        return _WHOLE
    # Floats keep value[0]: a round trip through a Python float could quiet a NaN's payload.
    return _INTEGER_SCALAR if np.dtype(f.dtype).kind in "biu" else _SCALAR


def _where(where: str | Callable[[], str]) -> str:
    return where if isinstance(where, str) else where()


class SharedBatchRing:
    """``size`` batch buffers in shared memory, so worker processes can write rows in place."""

    def __init__(self, layout: BatchLayout, size: int) -> None:
        _, block_bytes = layout.offsets()
        self.layout = layout
        self.blocks: list[shared_memory.SharedMemory] = []
        try:
            for _ in range(size):
                self.blocks.append(shared_memory.SharedMemory(create=True, size=block_bytes))
        except BaseException:
            self.close()
            raise
        self.buffers = [BatchBuffer(layout, block.buf) for block in self.blocks]

    @property
    def names(self) -> list[str]:
        return [block.name for block in self.blocks]

    def close(self) -> None:
        buffers = getattr(self, "buffers", [])
        for buffer in buffers:
            buffer.arrays.clear()
            buffer._plan = []
            buffer._raw = np.empty(0, dtype=np.uint8)
        self.buffers = []
        for block in self.blocks:
            try:
                block.close()
            except BufferError:
                _abandon_mapping(block)
            try:
                block.unlink()
            except FileNotFoundError:
                pass
        self.blocks = []


def _abandon_mapping(block: shared_memory.SharedMemory) -> None:
    """Close a block whose memory a batch the caller still holds maps.

    The mapping is released with the caller's last array; the file descriptor is closed now,
    and the object forgets the mapping so that its finaliser does not try again.
    """
    fd = getattr(block, "_fd", -1)
    if isinstance(fd, int) and fd >= 0:
        os.close(fd)
    block._fd = -1  # type: ignore[attr-defined]
    block._buf = None  # type: ignore[attr-defined]
    block._mmap = None  # type: ignore[attr-defined]


def local_ring(layout: BatchLayout, size: int) -> list[BatchBuffer]:
    """``size`` batch buffers in ordinary process memory."""
    return [BatchBuffer(layout) for _ in range(size)]


BufferFactory = Callable[[BatchLayout, int], list[BatchBuffer]]
