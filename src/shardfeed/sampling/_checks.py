"""Argument checks shared by the sampling modules (errors name the value and the fix)."""

from __future__ import annotations

import operator

import numpy as np
import numpy.typing as npt


def as_int(value: object, name: str) -> int:
    """``value`` as a Python int (NumPy integers accepted); ``TypeError`` for anything else."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got the bool {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {value!r} of type {type(value).__name__}"
        ) from None


def as_index_array(values: npt.ArrayLike, size: int, what: str) -> npt.NDArray[np.int64]:
    """An integer array with every value in ``[0, size)``, as int64; ``IndexError`` if not."""
    array = np.asarray(values)
    if array.size == 0:
        return np.zeros(array.shape, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{what} indices must be integers, got an array of dtype {array.dtype}")
    lo, hi = int(array.min()), int(array.max())
    if lo < 0 or hi >= size:
        bad = lo if lo < 0 else hi
        raise IndexError(f"{what} {bad} out of range: valid are 0..{size - 1} ({size} in all)")
    return array.astype(np.int64, copy=False)


def as_index(value: object, size: int, what: str) -> int:
    """One index in ``[0, size)``; negative values count from the end, as for a list."""
    index = as_int(value, what)
    if index < 0:
        index += size
    if not 0 <= index < size:
        raise IndexError(f"{what} {value} out of range: valid are 0..{size - 1} ({size} in all)")
    return index


def as_key(key: int | slice | npt.ArrayLike, size: int, what: str) -> int | npt.NDArray[np.int64]:
    """A ``__getitem__`` key over ``size`` items: an int index (negative counts from the end),
    or an int64 array of indices (a slice gives the indices it selects); errors as above."""
    if isinstance(key, slice):
        return np.arange(*key.indices(size), dtype=np.int64)
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        return as_index(key, size, what)
    return as_index_array(key, size, what)
