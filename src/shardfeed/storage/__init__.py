"""Storage layer: byte sources for local files and fsspec URLs.

``open_source(url)`` is the only entry point the layers above need for reading shards.
"""

from __future__ import annotations

import os

from shardfeed.storage.base import ByteSource
from shardfeed.storage.local import LocalSource


def is_remote(url: str | os.PathLike[str]) -> bool:
    """True for ``scheme://`` URLs other than ``file://``."""
    text = os.fspath(url)
    return "://" in text and not text.startswith("file://")


def open_source(url: str | os.PathLike[str]) -> ByteSource:
    """Open a file for random access: a local path, or any fsspec URL (s3://, gs://, http://)."""
    text = os.fspath(url)
    if text.startswith("file://"):
        text = text[len("file://"):]
    if is_remote(text):
        from shardfeed.storage.remote import RemoteSource

        return RemoteSource(text)
    return LocalSource(text)


__all__ = ["ByteSource", "LocalSource", "is_remote", "open_source"]
