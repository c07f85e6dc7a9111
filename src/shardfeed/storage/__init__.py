"""Storage layer: byte sources for local files and fsspec URLs.

``open_source(url)`` is the only entry point the layers above need for reading shards.
"""

from __future__ import annotations

import os
from typing import Any

from shardfeed.storage.base import ByteSource
from shardfeed.storage.local import LocalSource


def is_remote(url: str | os.PathLike[str]) -> bool:
    """True for ``scheme://`` URLs other than ``file://``."""
    text = os.fspath(url)
    return "://" in text and not text.startswith("file://")


def open_source(url: str | os.PathLike[str], /, **options: Any) -> ByteSource:
    """Open a file for random access: a local path, or any fsspec URL (s3://, gs://, http://).

    ``options`` go to :class:`~shardfeed.storage.remote.RemoteSource` for URLs
    (``max_concurrency``, ``coalesce_gap_bytes``, ``max_request_bytes``, ``retries``,
    ``backoff_seconds``, ``max_backoff_seconds``, ``storage_options``, ``cache``). A local
    path takes none: reading it is one ``pread`` a range.
    """
    text = os.fspath(url)
    text = text.removeprefix("file://")
    if is_remote(text):
        from shardfeed.storage.remote import RemoteSource

        return RemoteSource(text, **options)
    if options:
        raise TypeError(
            f"options {sorted(options)} apply to URLs (s3://, gs://, ...) only, and "
            f"'{text}' is a local path; drop them"
        )
    return LocalSource(text)


__all__ = ["ByteSource", "LocalSource", "is_remote", "open_source"]
