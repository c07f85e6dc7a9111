"""cache_report(): what a disk cache folder of remote records holds (the CLI's ``cache``)."""

from __future__ import annotations

import os
from typing import Any

from shardfeed.storage.disk_cache import DiskCache


def cache_report(folder: str | os.PathLike[str], *, verify: bool = False, clear: bool = False,
                 objects: int = 10, trust_cache_dir: bool = False) -> dict[str, Any]:
    """Entries, bytes, the bound and the objects with most bytes cached in ``folder`` (a
    ``cache_dir``; ``trust_cache_dir``: one other users can write), the bytes of entries
    being written (``temp_bytes``); ``verify`` first reads every entry and removes the
    damaged ones (listed under ``"damaged"``); ``clear`` then removes everything."""
    cache = DiskCache.existing(folder, trust_folder=trust_cache_dir)
    try:
        damaged = cache.verify() if verify else []
        summary = cache.summary(objects=objects)
        if clear:
            cache.clear()
    finally:
        cache.close()
    return {
        "path": summary.path, "entries": summary.entries, "bytes": summary.bytes,
        "max_bytes": summary.max_bytes, "reserved": summary.reserved,
        "temp_bytes": summary.temp_bytes, "damaged": damaged,
        "objects": [{"url": u, "entries": n, "bytes": b} for u, n, b in summary.objects],
    }


__all__ = ["cache_report"]
