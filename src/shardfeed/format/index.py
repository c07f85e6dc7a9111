"""Per-shard index files: DALI-compatible text ``.idx`` and memory-mapped binary ``.idx.npy``.

Both hold the same information. In memory an index is the n+1 record start offsets of a
shard as ``uint64`` (the last one is the file size): record i spans
``[offsets[i], offsets[i+1])``, framing included. That is 8 bytes a record.
"""

from __future__ import annotations

import io
import os

import numpy as np

from shardfeed.errors import FormatError
from shardfeed.format import _fileio
from shardfeed.storage import is_remote


def _as_offsets(offsets: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(offsets)
    if arr.ndim != 1 or arr.size < 1:
        raise ValueError(
            f"{what}: offsets must be a 1-D array of n+1 record offsets (the last is the file "
            f"size), got shape {arr.shape}"
        )
    arr = arr.astype(np.uint64, copy=False)
    if arr.size > 1 and bool(np.any(arr[1:] < arr[:-1])):
        raise ValueError(f"{what}: offsets must be non-decreasing")
    return arr


def format_text_index(offsets: np.ndarray) -> bytes:
    """The text of a ``.idx`` file: one ``offset size`` line per record."""
    arr = _as_offsets(offsets, "text index")
    starts = arr[:-1]
    sizes = np.diff(arr)
    # one join over Python ints: about 0.3 s for a million records
    lines = [f"{o} {s}\n" for o, s in zip(starts.tolist(), sizes.tolist())]
    return "".join(lines).encode("ascii")


def write_text_index(path: str | os.PathLike[str], offsets: np.ndarray) -> None:
    """Write the ``.idx`` file of a shard exactly as DALI's ``tfrecord2idx`` does.

    ``offsets`` are the n+1 record offsets; each line is ``offset size`` with size the
    distance to the next record (framing included).
    """
    _fileio.write_bytes_atomic(path, format_text_index(offsets))


def parse_text_index(text: bytes, *, path: str = "<memory>") -> np.ndarray:
    """Parse ``.idx`` text into n+1 offsets; the records must be contiguous from byte 0."""
    try:
        values = np.array(text.split(), dtype=np.uint64)
    except ValueError:
        raise FormatError(
            f"file '{path}' is not an index file (expected lines of two integers "
            "'offset size'); delete it and re-run `shardfeed index`"
        ) from None
    if values.size % 2:
        raise FormatError(
            f"file '{path}' is not an index file (odd number of integers); delete it and "
            "re-run `shardfeed index`"
        )
    pairs = values.reshape(-1, 2)
    if pairs.shape[0] == 0:
        return np.zeros(1, dtype=np.uint64)
    starts, sizes = pairs[:, 0], pairs[:, 1]
    ends = starts + sizes
    if starts[0] != 0 or bool(np.any(starts[1:] != ends[:-1])):
        bad = 0 if starts[0] != 0 else int(np.flatnonzero(starts[1:] != ends[:-1])[0]) + 1
        raise FormatError(
            f"file '{path}', line {bad + 1}: index records are not contiguous from byte 0 "
            f"(record {bad} starts at byte {int(starts[bad])}); delete the index and re-run "
            "`shardfeed index`"
        )
    out = np.empty(pairs.shape[0] + 1, dtype=np.uint64)
    out[:-1] = starts
    out[-1] = ends[-1]
    return out


def read_text_index(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a ``.idx`` file into n+1 offsets (uint64)."""
    return parse_text_index(_fileio.read_bytes(path), path=os.fspath(path))


def write_binary_index(path: str | os.PathLike[str], offsets: np.ndarray) -> None:
    """Write the ``.idx.npy`` file: the n+1 offsets as a ``uint64`` NumPy array."""
    arr = _as_offsets(offsets, "binary index")
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr, dtype="<u8"), allow_pickle=False)
    _fileio.write_bytes_atomic(path, buf.getvalue())


def load_binary_index(path: str | os.PathLike[str], *, mmap: bool = True) -> np.ndarray:
    """Load a ``.idx.npy`` file; memory-mapped read-only when local and ``mmap``.

    Checks the header (dtype, 1-D, at least one entry, first offset 0); raises
    :class:`FormatError` naming the file otherwise.
    """
    text = os.fspath(path)
    if mmap and not is_remote(text):
        try:
            arr = np.load(text.removeprefix("file://"), mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            if isinstance(exc, OSError) and exc.errno is not None:
                raise  # missing file, too many open files, ...: not the index's fault
            raise _not_binary(text, exc) from exc
        return _check_binary(arr, text)
    return parse_binary_index(_fileio.read_bytes(text), path=text)


def parse_binary_index(data: bytes, *, path: str = "<memory>") -> np.ndarray:
    """The offsets held by the bytes of a ``.idx.npy`` file (checked as by load_binary_index)."""
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise _not_binary(path, exc) from exc
    return _check_binary(arr, path)


def _not_binary(path: str, exc: BaseException) -> FormatError:
    return FormatError(
        f"file '{path}' is not a binary index ({exc}); delete it and re-run `shardfeed index`"
    )


def _check_binary(arr: object, text: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise FormatError(
            f"file '{text}' is not a binary index; delete it and re-run `shardfeed index`"
        )
    if arr.dtype != np.dtype("<u8") or arr.ndim != 1 or arr.size < 1 or int(arr[0]) != 0:
        raise FormatError(
            f"file '{text}' is not a binary index (dtype {arr.dtype}, shape {arr.shape}); "
            "delete it and re-run `shardfeed index`"
        )
    return arr
