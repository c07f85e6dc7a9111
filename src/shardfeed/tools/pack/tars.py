"""WebDataset tar shards as rows: one row a sample, the members sharing a key.

Determinism: the rows are a function of the tars' bytes only.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator, Sequence
from typing import Any

from shardfeed.errors import PackError

IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm", "gif")
"""A WebDataset member with one of these extensions is the sample's image (the first found)."""


def tar_rows(paths: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Samples of WebDataset tar shards: consecutive members sharing a key (the name up to
    the first dot of its last part) form one row, ``{"__key__": key, ext: bytes, ...}``; the
    image is under ``image``, a ``cls`` text under ``label`` (int), ``json`` parsed."""
    for path in paths:
        try:
            with tarfile.open(path, "r:*") as tar:
                yield from _tar_samples(tar, path)
        except (tarfile.TarError, OSError) as exc:
            raise PackError(f"cannot read the tar file '{path}': {exc}") from None


def _tar_samples(tar: tarfile.TarFile, path: str) -> Iterator[dict[str, Any]]:
    import json

    sample: dict[str, Any] = {}
    key = None
    for member in tar:
        if not member.isfile():
            continue
        folder, _, base = member.name.rpartition("/")
        stem, dot, ext = base.partition(".")
        if not dot:
            continue
        name = f"{folder}/{stem}" if folder else stem
        if name != key and sample:
            yield _tar_row(sample, path)
            sample = {}
        key = name
        f = tar.extractfile(member)
        data = f.read() if f is not None else b""
        sample["__key__"] = name
        ext = ext.lower()
        if ext in ("cls", "cls2", "index"):
            sample["label" if ext == "cls" else ext] = int(data.decode().strip())
        elif ext == "json":
            sample.update(json.loads(data))
        elif ext in ("txt", "text"):
            sample[ext] = data.decode()
        else:
            sample[ext] = data
    if sample:
        yield _tar_row(sample, path)


def _tar_row(sample: dict[str, Any], path: str) -> dict[str, Any]:
    for ext in IMAGE_SUFFIXES:
        if ext in sample:
            sample["image"] = sample.pop(ext)
            return sample
    raise PackError(f"'{path}': sample '{sample.get('__key__')}' has no image member "
                    f"(extensions {', '.join(IMAGE_SUFFIXES)})")


__all__ = ["IMAGE_SUFFIXES", "tar_rows"]
