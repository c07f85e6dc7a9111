"""Local files read with ``os.pread`` on one cached descriptor per file, or mapped."""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Sequence

from shardfeed.errors import StorageError


class LocalSource:
    """Random access to a local file. Thread-safe: ``pread`` has no shared file position.

    Memory: one open descriptor, opened on first use and kept until ``close``; once
    :meth:`mapping` is asked for, the file mapped read-only (and a second descriptor, the
    map's own), whose resident pages the caller drops with ``madvise``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.url = os.fspath(path)
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._map: mmap.mmap | None = None
        self._unmappable = False

    def _descriptor(self) -> int:
        fd = self._fd
        if fd is None:
            with self._lock:
                if self._fd is None:
                    try:
                        self._fd = os.open(self.url, os.O_RDONLY)
                    except FileNotFoundError:
                        raise StorageError(
                            f"file '{self.url}' does not exist; check the path, or rebuild the "
                            "manifest with 'shardfeed index' if the shards were moved"
                        ) from None
                    except OSError as exc:
                        raise StorageError(f"cannot open file '{self.url}': {exc}") from exc
                fd = self._fd
        return fd

    def size(self) -> int:
        return os.fstat(self._descriptor()).st_size

    def read(self, offset: int, length: int) -> bytes:
        fd = self._descriptor()
        data = os.pread(fd, length, offset)
        if len(data) == length or not data:
            return data
        return self._read_rest(fd, data, offset, length)

    @staticmethod
    def _read_rest(fd: int, data: bytes, offset: int, length: int) -> bytes:
        # pread may return short reads on some filesystems; keep reading until EOF.
        parts = [data]
        got = len(data)
        while got < length:
            more = os.pread(fd, length - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        fd = self._descriptor()
        out = []
        for offset, length in ranges:  # read() inlined: many small ranges are call-bound
            data = os.pread(fd, length, offset)
            out.append(data if len(data) == length or not data
                       else self._read_rest(fd, data, offset, length))
        return out

    def mapping(self, *, create: bool = True) -> mmap.mmap | None:
        """The whole file mapped read-only, as it was when first asked for (later growth is
        not in it); None where it cannot be mapped (an empty file, a file system or file
        kind without maps). A page the file has lost since (cut short) raises SIGBUS when
        read: only code that catches it (``shardfeed.format.native``) reads the map.
        ``create=False``: the map only if one was made already."""
        m = self._map
        if m is None and create and not self._unmappable:
            fd = self._descriptor()
            with self._lock:
                if self._map is None and not self._unmappable:
                    try:
                        self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                    except (OSError, ValueError):
                        self._unmappable = True
                m = self._map
        return m

    def close(self) -> None:
        with self._lock:
            # a map still read by a gather stays alive (its buffer holds it) until that ends
            self._map = None
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> LocalSource:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        # os.close bound at definition: at interpreter exit the module's globals are gone
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:
                _close(fd)
            except OSError:
                pass
