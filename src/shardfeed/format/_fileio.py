"""Whole-file reads and atomic writes for the format layer (local paths and URLs).

A thin seam over :mod:`shardfeed.storage.files`, so the format modules name one place for
file access.
"""

from __future__ import annotations

import os

from shardfeed.storage import files


def read_bytes(path: str | os.PathLike[str], *,
               max_bytes: int = files.DEFAULT_READ_LIMIT_BYTES) -> bytes:
    """The whole content of a local file or URL (StorageError naming it if missing, or if
    it is larger than ``max_bytes``)."""
    return files.read_bytes(path, max_bytes=max_bytes)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` under a temporary name, fsync, and rename into place."""
    files.write_bytes_atomic(path, data)


def create_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` as ``path`` only if nothing has that name (FileExistsError otherwise)."""
    files.create_bytes(path, data)


def exists(path: str | os.PathLike[str]) -> bool:
    """True if the local file or URL exists."""
    return files.exists(path)


def size(path: str | os.PathLike[str]) -> int:
    """Size in bytes of a local file or URL."""
    return files.size(path)


def fsync_folder(folder: str) -> None:
    """Make a rename inside ``folder`` durable (POSIX); a no-op where folders cannot be opened."""
    files.fsync_folder(folder)
