"""ShardWriter: write one TFRecord shard safely (temp names, fsync, renames).

::

    open            write ... write          close()
    path.tmp  --->  records appended  --->  path.idx.tmp, path.idx.npy.tmp written, fsynced
                                            renamed to path.idx, path.idx.npy; then
                                            path.tmp fsynced, renamed to path; dir fsynced
                    abort(), an exception in the `with` block, or a failed write or
                    close (disk full, folder not writable): every file it wrote removed

Every file is written under a temporary name and renamed into place; a shard exists under its
final name only when it is complete and indexed. A failure leaves nothing behind (no ``.tmp``,
no index without its shard); only a killed process can leave a ``.tmp`` file, which a resumed
``pack`` overwrites. Failures of the disk or folder raise :class:`StorageError` naming the
file and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from shardfeed.errors import StorageError
from shardfeed.format import _fileio
from shardfeed.format.crc import mask
from shardfeed.format.example import encode_example
from shardfeed.format.index import format_text_index
from shardfeed.format.manifest import ShardInfo
from shardfeed.format.records_hash import RecordsHash
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
        self._hash = RecordsHash()
        self._info: ShardInfo | None = None
        self._closed = False
        try:
            self._file = open(self.temp_path, "wb", buffering=WRITE_BUFFER_BYTES)  # noqa: SIM115
        except OSError as exc:
            raise StorageError(
                f"cannot create shard '{self.temp_path}': {describe_os_error(exc)}"
            ) from exc

    @property
    def records(self) -> int:
        """Records written so far."""
        return len(self._offsets) - 1

    def write(self, payload: bytes | bytearray | memoryview) -> int:
        """Append one record; returns its index within the shard."""
        if self._closed:
            raise ValueError(f"shard '{self.path}' is already closed; open a new ShardWriter")
        data = payload if type(payload) is bytes else bytes(payload)
        length = _LENGTH.pack(len(data))
        head = length + _CRC.pack(mask(google_crc32c.value(length)))
        data_crc = google_crc32c.value(data)
        tail = _CRC.pack(mask(data_crc))
        fh = self._file
        try:
            fh.write(head)
            fh.write(data)
            fh.write(tail)
        except OSError as exc:
            self.abort()
            raise StorageError(
                f"cannot write shard '{self.path}' (the partial shard was removed): "
                f"{describe_os_error(exc)}"
            ) from exc
        crc = google_crc32c.extend(self._crc, head)
        crc = google_crc32c.extend(crc, data)
        self._crc = google_crc32c.extend(crc, tail)
        self._hash.add(len(data), data_crc)
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
        text_path, binary_path = text_index_path(self.path), binary_index_path(self.path)
        placed: list[str] = []  # final names this close has put in place
        current = self.temp_path
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            current = text_path
            _write_file(text_path + TEMP_SUFFIX, format_text_index(offsets))
            current = binary_path
            _write_file(binary_path + TEMP_SUFFIX, _binary_index_bytes(offsets))
            for final in (text_path, binary_path):
                current = final
                os.replace(final + TEMP_SUFFIX, final)
                placed.append(final)
            current = self.path
            os.replace(self.temp_path, self.path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                self._file.close()  # after a failed flush this fails again: nothing to keep
            for path in (self.temp_path, text_path + TEMP_SUFFIX, binary_path + TEMP_SUFFIX,
                         *placed):
                _remove(path)
            if isinstance(exc, OSError):
                raise StorageError(
                    f"cannot finish shard '{self.path}' (writing '{current}'; nothing of "
                    f"this shard was kept): {describe_os_error(exc)}"
                ) from exc
            raise
        _fileio.fsync_folder(os.path.dirname(os.path.abspath(self.path)))
        self._info = ShardInfo(
            path=self.name, records=self.records, bytes=int(offsets[-1]), crc32c=self._crc,
            records_hash=self._hash.value,
        )
        return self._info

    def abort(self) -> None:
        """Drop the shard: the temp file is removed, nothing appears under the final name."""
        if self._info is not None or self._closed:
            self._closed = True
            return
        self._closed = True
        try:
            with contextlib.suppress(OSError):  # a shard being dropped: its bytes do not matter
                self._file.close()
        finally:
            self._remove_temp()

    def _remove_temp(self) -> None:
        _remove(self.temp_path)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def describe_os_error(exc: OSError) -> str:
    """What an OS error while writing means for the user, in words: ``the disk is full``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full (no space left on device): free space"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied: make the folder writable, or write elsewhere"
    if exc.errno == errno.EROFS:
        return "the file system is read-only: write elsewhere"
    return exc.strerror or str(exc)


def _write_file(path: str, data: bytes) -> None:
    """Write ``data`` as the whole of the new file ``path`` and fsync it."""
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _binary_index_bytes(offsets: np.ndarray) -> bytes:
    """The bytes of a ``.idx.npy`` file (what ``write_binary_index`` writes)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(offsets, dtype="<u8"), allow_pickle=False)
    return buf.getvalue()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
