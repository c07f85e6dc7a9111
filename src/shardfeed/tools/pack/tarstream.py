"""A tar file read as a stream for ``tarfile``: decompressed by its magic (gzip, bzip2, xz)
and with every read bounded, so that no header can make ``tarfile`` allocate what the tar
claims (:mod:`~shardfeed.tools.pack.tars` reads WebDataset shards through it).

Determinism: the bytes of the file. Memory: the read asked for, at most
:data:`HEADER_BYTES` while headers are read.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma

from shardfeed.format import spec

HEADER_BYTES = 1 << 20
"""The most bytes read at once for a tar header (a PAX header, a GNU long name)."""


def decompressed(raw: io.BufferedIOBase) -> io.BufferedIOBase:
    """``raw`` itself, or a decompressing reader over it (gzip, bzip2, xz: by magic)."""
    magic = raw.read(6)
    raw.seek(0)
    if magic[:2] == spec.GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if magic[:3] == b"BZh":
        return bz2.BZ2File(raw)
    if magic == b"\xfd7zXZ\x00":
        return lzma.LZMAFile(raw)  # type: ignore[arg-type]
    return raw


class TooLarge(Exception):
    """A read larger than allowed: ``size`` bytes at about byte ``at`` of the stream."""

    def __init__(self, size: int, at: int) -> None:
        super().__init__(size, at)
        self.size, self.at = size, at


class Guarded:
    """A file for ``tarfile`` whose reads are bounded: :data:`HEADER_BYTES` at once, or
    the size of the member being read (``allow``), so that no header can make ``tarfile``
    allocate what the tar claims."""

    def __init__(self, inner: io.BufferedIOBase) -> None:
        self._inner = inner
        self.allowed = HEADER_BYTES

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > self.allowed:
            raise TooLarge(-1 if size is None else size, self._inner.tell())
        return self._inner.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._inner.seek(offset, whence)

    def tell(self) -> int:
        return self._inner.tell()


__all__ = ["HEADER_BYTES", "Guarded", "TooLarge", "decompressed"]
