"""Whole-file reads and atomic writes for the format layer (local paths and URLs).

Delegates to :mod:`shardfeed.storage.files` when it is available; local paths otherwise use
the standard library (temp name, fsync, rename).
"""

from __future__ import annotations

import importlib
import os
import types
import uuid

from shardfeed.errors import StorageError
from shardfeed.storage import is_remote

_files: types.ModuleType | None
try:  # the storage helper for URLs; local paths work without it
    _files = importlib.import_module("shardfeed.storage.files")
except ImportError:  # pragma: no cover - depends on the storage layer's version
    _files = None


def _local(path: str | os.PathLike[str]) -> str:
    text = os.fspath(path)
    return text.removeprefix("file://")


def _need_files(url: str) -> types.ModuleType:
    if _files is None:
        raise StorageError(
            f"cannot access '{url}': remote URLs need shardfeed.storage.files, which this "
            "installation lacks; reinstall shardfeed"
        )
    return _files


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The whole content of a local file or URL."""
    text = os.fspath(path)
    if is_remote(text):
        data: bytes = _need_files(text).read_bytes(text)
        return data
    try:
        with open(_local(text), "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise StorageError(f"file '{text}' does not exist; check the path") from None
    except OSError as exc:
        raise StorageError(f"cannot read file '{text}': {exc}") from exc


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` under a temporary name, fsync, and rename into place."""
    text = os.fspath(path)
    if is_remote(text):
        _need_files(text).write_bytes_atomic(text, data)
        return
    local = _local(text)
    tmp = f"{local}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, local)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StorageError(f"cannot write file '{text}': {exc}") from exc


def exists(path: str | os.PathLike[str]) -> bool:
    """True if the local file or URL exists."""
    text = os.fspath(path)
    if is_remote(text):
        return bool(_need_files(text).exists(text))
    return os.path.exists(_local(text))


def size(path: str | os.PathLike[str]) -> int:
    """Size in bytes of a local file or URL."""
    text = os.fspath(path)
    if is_remote(text):
        return int(_need_files(text).size(text))
    try:
        return os.stat(_local(text)).st_size
    except FileNotFoundError:
        raise StorageError(f"file '{text}' does not exist; check the path") from None
