"""Per-shard index files: DALI-compatible text ``.idx`` and memory-mapped binary ``.idx.npy``.

Both hold the same information. In memory an index is the n+1 record start offsets of a
shard as ``uint64`` (the last one is the file size): record i spans
``[offsets[i], offsets[i+1])``, framing included. That is 8 bytes a record.

Index files come with downloaded datasets, so loading one checks it whole, in time linear
in its size and without allocating anything its numbers claim: first offset 0, every record
at least its 16 framing bytes long, offsets strictly increasing and within the largest file
size (:func:`check_index`). Whether the index ends at the shard's size and holds the
manifest's record count is checked where the shard is known (``dataset/shards.py``).
"""

from __future__ import annotations

import io
import os
import re

import numpy as np

from shardfeed.errors import FormatError
from shardfeed.format import _fileio, npyfile
from shardfeed.format import spec as S
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


_INDEX_BYTES = b"0123456789 \t\n\r\x0b\x0c"
"""The bytes of a ``.idx`` file: decimal digits and the whitespace ``bytes.split`` splits on."""
_NOT_INDEX_BYTE = rb"[^0-9 \t\n\r\x0b\x0c]"


def parse_text_index(text: bytes, *, path: str = "<memory>") -> np.ndarray:
    """Parse ``.idx`` text into n+1 offsets; the records must be contiguous from byte 0.

    The text is untrusted: anything but lines of two decimal numbers, a number past
    :data:`~shardfeed.format.spec.MAX_FILE_BYTES`, a record of fewer than 16 bytes (its
    framing) or records that do not follow one another raise :class:`FormatError` naming
    the file and line. Time and memory are linear in the text.
    """
    if text.translate(None, _INDEX_BYTES):  # a sign, a letter, an underscore, ...
        line = _line_of(text, _NOT_INDEX_BYTE)
        raise FormatError(
            f"file '{path}', line {line}: not an index file (expected lines of two decimal "
            "integers 'offset size'); delete it and re-run `shardfeed index`"
        )
    try:
        values = np.array(text.split(), dtype=np.uint64)
    except OverflowError:  # a number of 2**64 or more
        raise _past_the_end(path, _line_of(text, rb"[0-9]{20}")) from None
    if values.size % 2:
        raise FormatError(
            f"file '{path}' is not an index file (odd number of integers); delete it and "
            "re-run `shardfeed index`"
        )
    pairs = values.reshape(-1, 2)
    if pairs.shape[0] == 0:
        return np.zeros(1, dtype=np.uint64)
    if bool(np.any(pairs > S.MAX_FILE_BYTES)):
        raise _past_the_end(path, int(np.flatnonzero(np.any(pairs > S.MAX_FILE_BYTES,
                                                            axis=1))[0]) + 1)
    starts, sizes = pairs[:, 0], pairs[:, 1]
    ends = starts + sizes  # both < 2**63: no wrap-around
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
    check_index(out, path=path, line_numbers=True)
    return out


def _line_of(text: bytes, pattern: bytes) -> int:
    """The line number (from 1) of the first match of ``pattern`` (an error path only)."""
    found = re.search(pattern, text)
    return 1 if found is None else text.count(b"\n", 0, found.start()) + 1


def _past_the_end(path: str, line: int) -> FormatError:
    return FormatError(
        f"file '{path}', line {line}: a number past the largest file size "
        f"({S.MAX_FILE_BYTES}); the index is damaged: delete it and re-run `shardfeed index`"
    )


CHECK_CHUNK = 1 << 20
"""Offsets checked at a time: bounds the temporaries of :func:`check_index` (16 MiB)."""


def check_index(offsets: np.ndarray, *, path: str, line_numbers: bool = False) -> None:
    """Raise :class:`FormatError` unless ``offsets`` is an index of TFRecord records: at least
    one entry, the first 0, each record at least 16 bytes (its framing) after the previous
    one (so strictly increasing), none past :data:`~shardfeed.format.spec.MAX_FILE_BYTES`.

    Linear time; memory for one chunk of ``CHECK_CHUNK`` offsets (a mapped index is paged
    in, not copied). Whether the last offset is the shard's size is for the caller, who
    knows the shard. ``line_numbers``: name ``.idx`` lines in messages, else entries.
    """
    n = len(offsets)
    if n < 1 or int(offsets[0]) != 0:
        first = "no entries" if n < 1 else f"the first offset is {int(offsets[0])}"
        raise FormatError(
            f"file '{path}' is not an index: {first}, where the first record starts at byte 0; "
            "delete it and re-run `shardfeed index`"
        )
    previous = 0
    for lo in range(1, n, CHECK_CHUNK):
        chunk = np.asarray(offsets[lo:lo + CHECK_CHUNK], dtype=np.uint64)
        wild = chunk > S.MAX_FILE_BYTES
        if bool(wild.any()):
            k = lo + int(np.flatnonzero(wild)[0])
            raise FormatError(
                f"file '{path}', {_entry(k, line_numbers)}: offset {int(offsets[k])} is past "
                f"the largest file size ({S.MAX_FILE_BYTES}); the index is damaged: delete it "
                "and re-run `shardfeed index`"
            )
        # all < 2**63 now: signed differences cannot wrap
        gaps = np.diff(chunk.astype(np.int64), prepend=np.int64(previous))
        short = gaps < S.FRAMING_BYTES
        if bool(short.any()):
            k = lo + int(np.flatnonzero(short)[0])
            raise FormatError(
                f"file '{path}', {_entry(k - 1, line_numbers)}: record {k - 1} starts at byte "
                f"{int(offsets[k - 1])} and the next at byte {int(offsets[k])}; a record takes "
                f"at least {S.FRAMING_BYTES} bytes and records follow one another. The index "
                "is damaged: delete it and re-run `shardfeed index`"
            )
        previous = int(chunk[-1])


def _entry(k: int, line_numbers: bool) -> str:
    return f"line {k + 1}" if line_numbers else f"entry {k}"


def read_text_index(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a ``.idx`` file into n+1 offsets (uint64)."""
    return parse_text_index(_fileio.read_bytes(path), path=os.fspath(path))


def write_binary_index(path: str | os.PathLike[str], offsets: np.ndarray) -> None:
    """Write the ``.idx.npy`` file: the n+1 offsets as a ``uint64`` NumPy array."""
    arr = _as_offsets(offsets, "binary index")
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr, dtype="<u8"), allow_pickle=False)
    _fileio.write_bytes_atomic(path, buf.getvalue())


BINARY_DTYPES = ("<u8",)
"""The type of ``.idx.npy`` values (little-endian uint64)."""
_BINARY = "a binary index"
_BINARY_FIX = "delete it and re-run `shardfeed index`"


def load_binary_index(path: str | os.PathLike[str], *, mmap: bool = True) -> np.ndarray:
    """Load a ``.idx.npy`` file; memory-mapped read-only when local and ``mmap``.

    The file is untrusted: its header is checked without NumPy's literal parser, its length
    against the header, and its offsets as by :func:`check_index`. Raises
    :class:`FormatError` naming the file otherwise; ``OSError`` for a missing or
    unreadable local file.
    """
    text = os.fspath(path)
    if mmap and not is_remote(text):
        local = text.removeprefix("file://")
        arr = npyfile.map_vector(local, dtypes=BINARY_DTYPES, what=_BINARY, fix=_BINARY_FIX)
        check_index(arr, path=text)
        return arr
    return parse_binary_index(_fileio.read_bytes(text), path=text)


def parse_binary_index(data: bytes, *, path: str = "<memory>") -> np.ndarray:
    """The offsets held by the bytes of a ``.idx.npy`` file (checked as by load_binary_index)."""
    arr = npyfile.parse_vector(data, path=path, dtypes=BINARY_DTYPES, what=_BINARY,
                               fix=_BINARY_FIX)
    check_index(arr, path=path)
    return arr
