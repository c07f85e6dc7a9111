"""ShardWriter: write one TFRecord shard safely (temp name, indexes, fsync, rename).

::

    open            write ... write          close()
    path.tmp  --->  records appended  --->  path.idx, path.idx.npy written (atomic)
                                            path.tmp fsynced, renamed to path, dir fsynced
                    abort() or an exception in the `with` block: path.tmp removed

A shard therefore exists under its final name only when it is complete and indexed; an
interrupted ``pack`` leaves at most a ``.tmp`` file, which a resumed run overwrites.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from shardfeed.errors import FormatError
from shardfeed.format import _fileio
from shardfeed.format.crc import mask
from shardfeed.format.example import encode_example
from shardfeed.format.index import write_binary_index, write_text_index
from shardfeed.format.manifest import ShardInfo
from shardfeed.format.spec import (
    FRAMING_BYTES,
    TEMP_SUFFIX,
    binary_index_path,
    text_index_path,
)
from shardfeed.storage import is_remote

if TYPE_CHECKING:
    from typing_extensions import Self

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
WRITE_BUFFER_BYTES = 1 << 20


class ShardWriter:
    """Write records to one local shard; a context manager.

    ``write(payload)`` appends one framed record and returns its index in the shard;
    ``write_example(features)`` encodes a ``tf.train.Example`` first. ``close()`` finishes
    the shard and returns its :class:`ShardInfo` (``name`` defaults to the file's base name,
    the path the manifest records). Not thread-safe: one writer per thread.

    Memory: a 1 MiB write buffer and 8 bytes a record for the offsets.
    """

    def __init__(self, path: str | os.PathLike[str], /, *, name: str | None = None) -> None:
        text = os.fspath(path)
        if is_remote(text):
            raise ValueError(
                f"ShardWriter writes local files only, got {text!r}; write the dataset to a "
                "local folder, then copy it to object storage"
            )
        self.path = text.removeprefix("file://")
        self.temp_path = self.path + TEMP_SUFFIX
        self.name = name if name is not None else os.path.basename(self.path)
        self._offsets: list[int] = [0]
        self._crc = 0
        self._info: ShardInfo | None = None
        self._closed = False
        try:
            self._file = open(self.temp_path, "wb", buffering=WRITE_BUFFER_BYTES)  # noqa: SIM115
        except OSError as exc:
            raise FormatError(f"cannot create shard '{self.temp_path}': {exc}") from exc

    @property
    def records(self) -> int:
        """Records written so far."""
        return len(self._offsets) - 1

    @property
    def bytes_written(self) -> int:
        """Bytes written so far (framing included)."""
        return self._offsets[-1]

    def write(self, payload: bytes | bytearray | memoryview) -> int:
        """Append one record; returns its index within the shard."""
        if self._closed:
            raise ValueError(f"shard '{self.path}' is already closed; open a new ShardWriter")
        data = payload if type(payload) is bytes else bytes(payload)
        length = _LENGTH.pack(len(data))
        head = length + _CRC.pack(mask(google_crc32c.value(length)))
        tail = _CRC.pack(mask(google_crc32c.value(data)))
        fh = self._file
        fh.write(head)
        fh.write(data)
        fh.write(tail)
        crc = google_crc32c.extend(self._crc, head)
        crc = google_crc32c.extend(crc, data)
        self._crc = google_crc32c.extend(crc, tail)
        self._offsets.append(self._offsets[-1] + len(data) + FRAMING_BYTES)
        return len(self._offsets) - 2

    def write_example(self, features: Mapping[str, Any]) -> int:
        """Encode ``features`` as a ``tf.train.Example`` and append it."""
        return self.write(encode_example(features))

    def close(self) -> ShardInfo:
        """Finish: indexes written, data fsynced, temp renamed to the final name. Idempotent."""
        if self._info is not None:
            return self._info
        if self._closed:
            raise ValueError(f"shard '{self.path}' was aborted; nothing to close")
        self._closed = True
        offsets = np.array(self._offsets, dtype=np.uint64)
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            write_text_index(text_index_path(self.path), offsets)
            write_binary_index(binary_index_path(self.path), offsets)
            os.replace(self.temp_path, self.path)
            _fileio.fsync_folder(os.path.dirname(os.path.abspath(self.path)))
        except OSError as exc:
            self._remove_temp()
            raise FormatError(f"cannot finish shard '{self.path}': {exc}") from exc
        self._info = ShardInfo(
            path=self.name, records=self.records, bytes=int(offsets[-1]), crc32c=self._crc
        )
        return self._info

    def abort(self) -> None:
        """Drop the shard: the temp file is removed, nothing appears under the final name."""
        if self._info is not None or self._closed:
            self._closed = True
            return
        self._closed = True
        try:
            self._file.close()
        finally:
            self._remove_temp()

    def _remove_temp(self) -> None:
        try:
            os.unlink(self.temp_path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

