"""Storage layer: byte sources for local files and fsspec URLs.

``open_source(url)`` is the only entry point the layers above need for reading shards.
"""

from __future__ import annotations

import os
from typing import Any

from shardfeed.storage.backends import Backend, set_obstore_provider
from shardfeed.storage.base import ByteSource
from shardfeed.storage.cache import ByteCache
from shardfeed.storage.local import LocalSource
from shardfeed.storage.process_state import SETTINGS


def _obstore(scheme: str) -> Backend | None:
    """The obstore backend of ``scheme`` where obstore is installed (imported on first
    use): http(s) lists through fsspec (web servers' index pages)."""
    from shardfeed.storage import obstore_stores

    if not obstore_stores.installed():
        return None
    from shardfeed.storage.obstore_ops import OBSTORE, OBSTORE_HTTP

    return OBSTORE_HTTP if scheme in ("http", "https") else OBSTORE


set_obstore_provider(_obstore)


def is_remote(url: str | os.PathLike[str]) -> bool:
    """True for ``scheme://`` URLs other than ``file://``."""
    text = os.fspath(url)
    return "://" in text and not text.startswith("file://")


def open_source(url: str | os.PathLike[str], /, **options: Any) -> ByteSource:
    """Open a file for random access: a local path, a URL of a registered backend
    (:mod:`shardfeed.storage.backends`), or any fsspec URL (s3://, gs://, http://).

    ``options`` go to the backend (those it declares), else to
    :class:`~shardfeed.storage.remote.RemoteSource` for URLs (``deadline_seconds``,
    ``max_concurrency``, ``coalesce_gap_bytes``, ``max_request_bytes``, ``retries``,
    ``backoff_seconds``, ``max_backoff_seconds``, ``storage_options``, ``cache``). A local
    path takes none: reading it is one ``pread`` a range.
    """
    text = os.fspath(url)
    text = text.removeprefix("file://")
    from shardfeed.storage.backends import backend_for
    from shardfeed.storage.calls import scoped

    if is_remote(text) and options.get("storage_options") is None and scoped(None):
        options["storage_options"] = scoped(None)  # a Dataset's, for its files' reads

    backend = backend_for(text, options.get("storage_options"))
    if backend is not None:
        return backend.opened(text, options)
    if is_remote(text):
        from shardfeed.storage.remote import RemoteSource

        return RemoteSource(text, **options)
    if options:
        raise TypeError(
            f"options {sorted(options)} apply to URLs (s3://, gs://, ...) only, and "
            f"'{text}' is a local path; drop them"
        )
    return LocalSource(text)


def set_index_cache(cache: ByteCache | None, /) -> None:
    """Keep the index files (``.idx.npy`` / ``.idx``) read from object storage in ``cache``.

    Off by default. With a cache, reopening a remote dataset in the same process (a new
    ``Dataset``, a process worker, a restarted epoch loop) reads its indexes from memory
    instead of the bucket: ``set_index_cache(ByteCache(max_bytes=256 << 20))``. The cache
    holds at most ``max_bytes`` (8 bytes a record of the cached shards); indexes are
    written once, so cached copies do not go stale unless a shard is re-indexed in place
    (then call ``cache.clear()``). Local indexes are memory-mapped and never cached.
    """
    if cache is not None and not isinstance(cache, ByteCache):
        raise TypeError(
            f"cache must be a storage.ByteCache or None, got {type(cache).__name__}; e.g. "
            "ByteCache(max_bytes=256 << 20)"
        )
    with SETTINGS.lock:
        SETTINGS.index_cache = cache


def index_cache() -> ByteCache | None:
    """The cache set with :func:`set_index_cache`, or None."""
    return SETTINGS.index_cache


__all__ = [
    "ByteCache",
    "ByteSource",
    "LocalSource",
    "index_cache",
    "is_remote",
    "open_source",
    "set_index_cache",
]
