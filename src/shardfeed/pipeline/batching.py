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
buffers a caller allocates (:meth:`BatchLayout.batch_bytes` each); a column renewed while the
caller holds its old memory (:meth:`BatchBuffer.renew_held`) leaves that memory to the caller.
"""

from __future__ import annotations

import os
import weakref
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


class _RingMemory(np.ndarray):
    """The loader's own memory behind a batch column (a private ndarray type).

    NumPy sets a new view's ``base`` to the first array down the chain that owns its data,
    but stops before a base of another type than the view. A handed-out column is a plain
    ndarray whose base is a ``_RingMemory``, so every plain view of it has the handed-out
    array itself as base; a view, ``torch.from_numpy`` tensor, memoryview or zero-copy JAX
    array made from it keeps that array alive, and a weak reference to it tells whether the
    caller still holds any of the memory.
    """


class BatchBuffer:
    """One batch's array columns plus its list columns, and what the caller still holds of it.

    Rows are written by several threads at once, each its own rows; lists are filled by index.
    Array columns live in process memory (one allocation each, so one can be renewed alone)
    or, given ``block``, at the layout's offsets in one block of shared memory.

    Handing out (:meth:`take`): columns of at most :data:`SMALL_COLUMN_BYTES` a batch (labels,
    indices) are copied, so keeping them pins nothing; larger ones (images, masks) are handed
    out as the buffer's own memory, and :meth:`held` says whether any array made from them
    is still alive.
    """

    def __init__(self, layout: BatchLayout, block: memoryview | None = None) -> None:
        self.layout = layout
        self.shared = block is not None
        # the block, the columns' owners and their memory are _RingMemory arrays (views of
        # a _RingMemory keep its type; NumPy's stubs type them as plain arrays)
        self._block: np.ndarray | None = None
        offsets, size = layout.offsets()
        if block is not None:
            # frombuffer holds a buffer export, so the block cannot be unmapped under an array
            self._block = np.frombuffer(block, dtype=np.uint8, count=size).view(_RingMemory)
        self._offsets = dict(zip((f.name for f in layout.fields), offsets))
        self._small = frozenset(
            f.name for f in layout.fields
            if f.is_array and layout.batch_size * f.row_bytes() <= SMALL_COLUMN_BYTES
        )
        self._owners: dict[str, np.ndarray] = {}
        self.arrays: dict[str, np.ndarray] = {}
        # per handed-out column: a weak reference to the array the caller was given
        self._handed: dict[str, weakref.ref[np.ndarray]] = {}
        for f in layout.fields:
            if f.is_array:
                self._place(f)
        self._build_plan()  # also when every column is a list (no _place to build it)
        self._names = frozenset(f.name for f in layout.fields)
        self.lists: dict[str, list[Any]] = {}
        self.reset_lists()
        # per row: the epoch position whose key made it (a replaced row: its stand-in's)
        self.keys = np.zeros(layout.batch_size, dtype=np.int64)

    def _place(self, f: Field) -> None:
        """Give column ``f`` its memory: new process memory, or its place in the block."""
        nbytes = self.layout.batch_size * f.row_bytes()
        if self._block is None:
            memory = _aligned_bytes(nbytes)
        else:
            offset = self._offsets[f.name]
            memory = self._block[offset : offset + nbytes]
        # every view on the way is a _RingMemory too, so a handed-out array stops at the owner
        owner = memory.view(np.dtype(f.dtype)).reshape((self.layout.batch_size, *f.shape))
        self._owners[f.name] = owner
        self.arrays[f.name] = owner.view(np.ndarray)
        self._handed.pop(f.name, None)
        self._build_plan()

    def _build_plan(self) -> None:
        # Per field: its column (None for lists), the shape and dtype a sample's value has,
        # and how a value of exactly that shape and dtype is stored (see _store_mode).
        self._plan: list[
            tuple[Field, str, np.ndarray | None, tuple[int, ...], np.dtype[Any], int]
        ] = [
            (f, f.name, self.arrays.get(f.name), (1,) if f.squeeze else f.shape,
             np.dtype(f.dtype) if f.is_array else np.dtype(np.uint8), _store_mode(f))
            for f in self.layout.fields
        ]

    def reset_lists(self) -> None:
        self.lists = {
            f.name: [None] * self.layout.batch_size for f in self.layout.fields if not f.is_array
        }

    # -- what the caller holds -------------------------------------------------------------

    def held_columns(self) -> list[str]:
        """Columns of which the caller still holds an array (or a view, tensor, ...)."""
        return [name for name, ref in self._handed.items() if ref() is not None]

    def held(self) -> bool:
        """Whether writing into this buffer could change anything the caller holds."""
        return any(ref() is not None for ref in self._handed.values())

    def renew_held(self) -> int:
        """Give every held column new memory (the caller keeps the old); how many were renewed.

        Only for buffers in process memory: worker processes know a shared block by name.
        """
        held = self.held_columns()
        if held and self.shared:
            raise RuntimeError("a batch buffer in shared memory cannot be given new memory")
        fields = {f.name: f for f in self.layout.fields}
        for name in held:
            self._place(fields[name])
        return len(held)

    def release_memory(self) -> None:
        """Drop every reference this buffer holds to its memory (before the block is closed)."""
        self.arrays.clear()
        self._owners.clear()
        self._handed.clear()
        self._plan = []
        self._block = None

    # -- writing -----------------------------------------------------------------------------

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
            if array.shape != shape or not _fits(array.dtype, np.dtype(f.dtype)):
                raise SchemaError(
                    f"feature {f.name!r} of sample {_where(where)} is {array.dtype} "
                    f"{array.shape}, but the batch holds {np.dtype(f.dtype)} {shape} (learned "
                    f"from the first sample): batched arrays need one shape; {_fix(array, shape)}"
                )
            self.arrays[f.name][row] = array[0] if f.squeeze else array

    def write_columns(self, first_row: int, columns: Mapping[str, Any], *,
                      written: Mapping[str, np.ndarray]) -> None:
        """Store rows ``first_row...`` from ``columns`` (one value a row per key, numeric
        columns as arrays of ``(rows, length)``); SchemaError (nothing said about which
        record) when they do not fit, for the caller to redo the rows one at a time.
        ``written``: columns already in place (their value *is* that slice of the batch)."""
        if columns.keys() != self._names:
            raise SchemaError("the columns do not hold the batch's keys")
        for f, name, column, shape, dtype, _ in self._plan:
            value = columns[name]
            if column is None:
                self.lists[name][first_row : first_row + len(value)] = value
                continue
            if value is written.get(name):
                continue
            if (not isinstance(value, np.ndarray) or value.shape[1:] != shape
                    or not _fits(value.dtype, dtype)):
                raise SchemaError(f"column {name!r} does not fit the batch")
            target = column[first_row : first_row + len(value)]
            target[...] = value.reshape(target.shape)

    def take(self, count: int, *, copy: bool) -> dict[str, Any]:
        """The batch of the first ``count`` rows, as a dict in the layout's key order.

        Large array columns are the buffer's own memory unless ``copy``; each such array is
        new (never an internal one), so :meth:`held` sees exactly what the caller keeps.
        """
        batch: dict[str, Any] = {}
        full = count == self.layout.batch_size
        for f in self.layout.fields:
            name = f.name
            if not f.is_array:
                batch[name] = self.lists[name][:count]
            elif copy or name in self._small:
                batch[name] = self.arrays[name][:count].copy()
            else:
                owner = self._owners[name]
                handed = (owner if full else owner[:count]).view(np.ndarray)
                self._handed[name] = weakref.ref(handed)
                batch[name] = handed
        return batch


SMALL_COLUMN_BYTES = 64 * 1024
"""Array columns of at most this many bytes a batch are handed out as copies."""


def _aligned_bytes(nbytes: int) -> np.ndarray:
    """``nbytes`` of new process memory (a :class:`_RingMemory`) at a multiple of 64 bytes.

    Aligned like the columns of a shared block (XLA on CPU uses such memory without a copy).
    """
    raw = _RingMemory((nbytes + _ALIGN,), dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + nbytes]


_WHOLE, _INTEGER_SCALAR, _SCALAR = 0, 1, 2


def _store_mode(f: Field) -> int:
    """How :meth:`BatchBuffer.write` stores a value of the field's own shape and dtype."""
    if not f.squeeze:
        return _WHOLE
    # Floats keep value[0]: a round trip through a Python float could quiet a NaN's payload.
    return _INTEGER_SCALAR if np.dtype(f.dtype).kind in "biu" else _SCALAR



def _fits(value: np.dtype[Any], column: np.dtype[Any]) -> bool:
    """Whether values of dtype ``value`` may be stored in a batch column of ``column``: a safe
    cast, or float to a narrower float (precision only). Never an integer cast that wraps
    (uint16 mask ids into a uint8 column would turn 300 into 44 without a word)."""
    return (value == column or bool(np.can_cast(value, column, "safe"))
            or (value.kind == "f" and column.kind == "f"))

def _fix(array: np.ndarray, shape: tuple[int, ...]) -> str:
    """What to do about a value of another shape than its batch column."""
    if array.ndim == len(shape) and array.ndim >= 1 and array.shape[1:] == shape[1:]:
        return ("its length varies from sample to sample (boxes, per-object fields): pad it "
                "to a fixed length with transforms.PadBoxes(max_boxes), which adds a count")
    return ("resize in the transform (e.g. presets.train(size=...)), or use transform=None to "
            "get encoded bytes")


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
            buffer.release_memory()
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

