"""Finding the shard files of a dataset for the tools (index, inspect, verify).

A dataset is named the ways ``Dataset`` accepts: a folder holding ``shardfeed.json``, the
manifest file itself, a folder of TFRecord files, a glob, or a list of files. The tools need
the file list without opening the records (a damaged shard must still be listed).
"""

from __future__ import annotations

import glob as _glob
import os
from collections.abc import Sequence

from shardfeed.dataset.opening import is_shard_name as _dataset_shard_name
from shardfeed.errors import ShardfeedError
from shardfeed.format import spec
from shardfeed.storage import files as storage_files
from shardfeed.storage import is_remote


def is_shard_name(name: str) -> bool:
    """True for the file names ``Dataset(folder)`` opens as shards (``*.tfrecord``,
    ``name-00001-of-00010``, Spark/Hadoop ``part-00000`` and ``part-r-00000``; never
    ``_SUCCESS``, ``*.crc``, indexes or hidden files): the tools list a folder exactly as
    ``Dataset`` does."""
    return _dataset_shard_name(os.path.basename(name.rstrip("/")))


def _has_magic(text: str) -> bool:
    return any(c in text for c in "*?[")


def expand_inputs(inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Files named by ``inputs``: files as given, folders as their shard files (sorted), globs
    expanded (sorted). Raises :class:`ShardfeedError` naming what matched nothing."""
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    if not items:
        raise ValueError("no input files given; name TFRecord files, a folder or a glob")
    files: list[str] = []
    for raw in items:
        text = os.fspath(raw)
        if is_remote(text):
            files.extend(_expand_remote(text))
        elif os.path.isdir(text):
            found = sorted(
                os.path.join(text, n)
                for n in os.listdir(text)
                if is_shard_name(n) and os.path.isfile(os.path.join(text, n))
            )
            if not found:
                raise ShardfeedError(
                    f"folder '{text}' holds no TFRecord files (names ending in .tfrecord or "
                    "like train-00000-of-00010 or part-r-00000); name the files or a glob "
                    "instead"
                )
            files.extend(found)
        elif _has_magic(text):
            found = sorted(p for p in _glob.glob(text) if os.path.isfile(p))
            if not found:
                raise ShardfeedError(f"pattern '{text}' matches no files; check the pattern")
            files.extend(found)
        else:
            files.append(text)
    seen: set[str] = set()
    unique = []
    for f in files:
        key = f if is_remote(f) else os.path.abspath(f)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _expand_remote(url: str) -> list[str]:
    """Shard URLs named by an object-storage URL: a glob, a prefix ending in '/', or a file."""
    if _has_magic(url):
        found = [u for u in storage_files.glob(url) if is_shard_name(u)]
        if not found:
            raise ShardfeedError(f"pattern '{url}' matches no TFRecord objects; check it")
        return found
    if url.endswith("/"):
        names = [n for n in storage_files.listdir(url) if is_shard_name(n)]
        if not names:
            raise ShardfeedError(
                f"prefix '{url}' holds no TFRecord objects; name the objects or a glob instead"
            )
        return [storage_files.join(url, n) for n in names]
    return [url]


def find_manifest(source: str | os.PathLike[str]) -> str | None:
    """The manifest path of ``source`` (a manifest file or a folder holding one), else None."""
    text = os.fspath(source)
    if os.path.isdir(text):
        candidate = os.path.join(text, spec.MANIFEST_NAME)
        return candidate if os.path.isfile(candidate) else None
    if text.endswith(".json") and os.path.isfile(text):
        return text
    return None
