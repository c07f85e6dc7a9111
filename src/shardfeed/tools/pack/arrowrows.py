"""Arrow record batches into rows of Python values, a bounded slice at a time.

A few bytes of Arrow can stand for a great deal of Python: a dictionary-encoded column
holds one value for many rows, a list of ten million int64 takes 80 MB as Arrow and 360 MB
as Python ints. What a row will take once converted is therefore computed from the batch's
offsets and lengths first (:func:`row_costs`: its bytes, and :data:`OBJECT_BYTES` a value),
without converting anything; a row over the limit of one record is refused, naming it and
its largest column, and the rest are converted in slices of at most :data:`BATCH_BYTES`
(one row, when a row is larger).

Determinism: the rows in batch order, as ``to_pylist`` gives them. Memory: one slice of
converted rows beside the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from shardfeed.errors import PackError
from shardfeed.tools.pack.limits import BATCH_BYTES, OBJECT_BYTES, IngestLimits


def row_costs(batch: Any) -> tuple[np.ndarray, np.ndarray]:
    """What each row of ``batch`` (a RecordBatch or Table) takes as Python values, in bytes,
    and the index of each row's largest column."""
    n = batch.num_rows
    columns = [np.broadcast_to(np.asarray(_costs(_array(c)), np.int64), (n,))
               for c in batch.columns]
    if not columns:
        return np.zeros(n, np.int64), np.zeros(n, np.int64)
    stacked = np.stack(columns)
    return stacked.sum(axis=0), stacked.argmax(axis=0)


def bounded_rows(batch: Any, *, limits: IngestLimits, where: Callable[[int], str],
                 first: int = 0) -> Iterator[dict[str, Any]]:
    """The rows of ``batch`` as dicts, converted a slice of at most :data:`BATCH_BYTES` at a
    time; PackError naming a row (``where(first + i)``, ``i`` its place in the batch) that
    would take more than one record may."""
    costs, largest = row_costs(batch)
    over = np.flatnonzero(costs > limits.record_bytes)
    if over.size:
        i = int(over[0])
        column = batch.schema.names[int(largest[i])]
        raise PackError(
            f"{where(first + i)}: its values take {int(costs[i])} bytes as Python objects (most in "
            f"column '{column}'), over the limit of {limits.record_bytes} for one record; "
            f"nothing of it was converted. Leave the column out, or split the row; "
            f"{limits.raise_it}")
    start = 0
    ends = np.cumsum(costs)
    while start < batch.num_rows:
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + BATCH_BYTES, side="right")))
        yield from batch.slice(start, stop - start).to_pylist()
        start = stop


def _array(column: Any) -> Any:
    """One Arrow array of a column (a Table's column is chunked)."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


Costs = np.ndarray | int
"""The bytes of each value of an array, or one figure for every value (fixed-width values:
no array of them is made, so that ten million numbers cost nothing to size)."""


def _costs(array: Any) -> Costs:
    """The bytes each value of ``array`` takes as Python objects."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if isinstance(kind, pa.ExtensionType):
        return _costs(array.storage)
    if pa.types.is_null(kind):
        return 0
    if pa.types.is_dictionary(kind):
        values = _costs(array.dictionary)
        if isinstance(values, int) or len(values) == 0:
            return values if isinstance(values, int) else OBJECT_BYTES
        indices = pc.fill_null(array.indices, 0).to_numpy(zero_copy_only=False)
        return np.asarray(values[indices.astype(np.int64)], np.int64)
    if (pa.types.is_binary(kind) or pa.types.is_string(kind) or pa.types.is_large_binary(kind)
            or pa.types.is_large_string(kind) or pa.types.is_binary_view(kind)
            or pa.types.is_string_view(kind)):
        lengths = pc.fill_null(pc.binary_length(array), 0)
        return np.asarray(lengths.to_numpy(zero_copy_only=False), np.int64) + OBJECT_BYTES
    if pa.types.is_struct(kind):
        total: Costs = OBJECT_BYTES
        for child in array.flatten():
            total = total + _costs(child)
        return total
    if pa.types.is_map(kind):
        array = array.cast(pa.list_(pa.struct([kind.key_field, kind.item_field])))
        kind = array.type
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind) or pa.types.is_list_view(kind)
            or pa.types.is_large_list_view(kind)):
        lengths = np.asarray(pc.fill_null(pc.list_value_length(array), 0).to_numpy(
            zero_copy_only=False), np.int64)
        inner = _costs(_child(array, kind))
        if isinstance(inner, int):
            return lengths * inner + OBJECT_BYTES
        sums = np.concatenate([[0], np.cumsum(inner)])
        ends = np.cumsum(lengths)
        return np.asarray(sums[ends] - sums[ends - lengths], np.int64) + OBJECT_BYTES
    bits = _bit_width(kind)
    if bits:
        return (bits + 7) // 8 + OBJECT_BYTES
    # a kind with no cheaper measure (a union, run-end encoded values): any row may hold
    # all of the column, and its values take up to 5 times their Arrow bytes as objects
    return 5 * int(array.nbytes) + OBJECT_BYTES


def _child(array: Any, kind: Any) -> Any:
    """The values of a list array's rows, in row order: an empty array of the value type
    when that type has one fixed width (only the type is looked at then)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if _bit_width(kind.value_type) and not isinstance(kind.value_type, pa.ExtensionType):
        return pa.array([], kind.value_type)
    return pc.list_flatten(array)


def _bit_width(kind: Any) -> int:
    """The bits of one value of a fixed-width type (numbers, booleans, times, decimals,
    fixed-size binary), else 0 (a dictionary type's width is its indices')."""
    import pyarrow as pa

    fixed = (pa.types.is_primitive(kind) or pa.types.is_decimal(kind)
             or pa.types.is_fixed_size_binary(kind))
    return int(kind.bit_width) if fixed else 0


__all__ = ["bounded_rows", "row_costs"]
