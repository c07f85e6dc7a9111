"""Turn what a user passes to ``Dataset(...)`` into a manifest or a list of shard files.

Accepted: a dataset folder (holding ``shardfeed.json``), a manifest path (``*.json``), a
folder of TFRecord files, a glob (``data/train-*``), one TFRecord file, or a list of
TFRecord paths/URLs (kept in the given order; folders and globs are sorted by name).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardfeed.errors import FormatError, StorageError
from shardfeed.format import spec as S
from shardfeed.format.example import FeatureSpec
from shardfeed.format.manifest import Manifest, dataset_dir, resolve
from shardfeed.storage import files, is_remote

SourceArg = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
Features = Mapping[str, FeatureSpec] | Sequence[str] | None

_GLOB_CHARS = re.compile(r"[*?\[]")
# TF's own naming (train.tfrecord-00001-of-00128, train-00001-of-01024) and common suffixes
_SHARD_NAME = re.compile(r"(\.tfrec(ord)?s?($|[.-]))|(-\d+-of-\d+$)")
_NOT_SHARDS = (S.TEXT_INDEX_SUFFIX, S.BINARY_INDEX_SUFFIX, S.TEMP_SUFFIX, ".json", ".npy")


@dataclass(frozen=True, slots=True)
class Resolved:
    """Where the shards are: ``manifest`` (with its ``manifest_url`` and folder ``base``) or
    a plain list of TFRecord ``urls``."""

    urls: tuple[str, ...]
    manifest: Manifest | None = None
    manifest_url: str | None = None
    base: str | None = None


def _is_shard_name(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    if base.startswith(".") or base.endswith(_NOT_SHARDS):
        return False
    return bool(_SHARD_NAME.search(base))


def _is_dir(url: str) -> bool:
    if is_remote(url):
        return url.endswith("/") or files.exists(files.join(url, S.MANIFEST_NAME))
    return os.path.isdir(url.removeprefix("file://"))


def _from_manifest(url: str) -> Resolved:
    manifest = Manifest.load(url)
    base = dataset_dir(url)
    urls = tuple(resolve(base, shard.path) for shard in manifest.shards)
    return Resolved(urls=urls, manifest=manifest, manifest_url=url, base=base)


def _from_folder(url: str) -> Resolved:
    manifest_url = files.join(url, S.MANIFEST_NAME)
    if files.exists(manifest_url):
        return _from_manifest(manifest_url)
    names = files.listdir(url)
    shards = [files.join(url, n) for n in names if _is_shard_name(n)]
    if not shards:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise FormatError(
            f"folder '{url}' has no {S.MANIFEST_NAME} and no TFRecord files (*.tfrecord, "
            f"*-NNNNN-of-NNNNN); it holds: {shown or 'nothing'}. Pass a glob or a list of "
            "the shard files instead"
        )
    return Resolved(urls=tuple(shards))


def _from_glob(pattern: str) -> Resolved:
    matches = [m for m in files.glob(pattern) if not m.endswith(_NOT_SHARDS)]
    if not matches:
        raise FormatError(f"no files match '{pattern}'; check the pattern")
    return Resolved(urls=tuple(matches))


def resolve_source(source: SourceArg) -> Resolved:
    """Find the manifest or the shard files ``source`` names."""
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if not text:
            raise ValueError("Dataset source is an empty string; pass a folder, file or glob")
        if _GLOB_CHARS.search(text):
            return _from_glob(text)
        if text.endswith(".json"):
            return _from_manifest(text)
        if _is_dir(text):
            return _from_folder(text)
        if not is_remote(text) and not os.path.exists(text.removeprefix("file://")):
            raise StorageError(f"'{text}' does not exist; check the path")
        return Resolved(urls=(text,))
    if isinstance(source, (bytes, bytearray)) or not isinstance(source, Sequence):
        raise TypeError(
            "Dataset source must be a folder, manifest, glob or file path, or a list of "
            f"TFRecord paths; got {type(source).__name__}"
        )
    urls: list[str] = []
    for item in source:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(
                f"Dataset source list must hold paths or URLs, got {type(item).__name__}"
            )
        urls.append(os.fspath(item))
    if not urls:
        raise ValueError("Dataset source list is empty; pass at least one TFRecord file")
    return Resolved(urls=tuple(urls))


def parse_features(
    features: Features,
) -> tuple[dict[str, FeatureSpec] | None, list[str] | None]:
    """Check ``features=``: (spec mapping, None), (None, names) or (None, None)."""
    if features is None:
        return None, None
    if isinstance(features, Mapping):
        spec: dict[str, FeatureSpec] = {}
        for name, fs in features.items():
            if not isinstance(name, str) or not isinstance(fs, FeatureSpec):
                raise TypeError(
                    "features= as a mapping must map names to FeatureSpec, got "
                    f"{name!r}: {type(fs).__name__}"
                )
            spec[name] = fs
        return spec, None
    if isinstance(features, (str, bytes)) or not isinstance(features, Sequence):
        raise TypeError(
            "features= must be a list of feature names or a mapping of name to FeatureSpec, "
            f"got {type(features).__name__}"
        )
    names = list(features)
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"features= names must be str, got {names!r}")
    return None, names
