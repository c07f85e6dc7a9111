"""Turn what a user passes to ``Dataset(...)`` into a manifest or a list of shard files.

Accepted: a dataset folder (holding ``shardfeed.json``), a manifest path (``*.json``), a
folder of TFRecord files, a glob (``data/train-*``), one TFRecord file, or a list of
TFRecord paths/URLs (kept in the given order; folders and globs are sorted by name).

Shard names in a folder: ``*.tfrecord`` (and ``.tfrecords``, ``.tfrec``), TF's
``name-00001-of-01024``, and Spark/Hadoop output (``part-00000``, ``part-r-00000``,
``part-m-00000``, with or without an extension); ``_SUCCESS``, ``*.crc`` and hidden files
are skipped. On object storage a URL is a folder unless its name is a shard name (end a
folder's URL with ``/`` when its name looks like a shard's); opening a dataset folder costs
one GET (its manifest), a folder of bare shards one GET and one listing.

A path that exists is opened as that path even when its name holds ``*``, ``?`` or ``[``
(``exp[1]/ds``); only a name that does not exist is taken as a glob.

Whatever form names the files, a folder whose dataset was never committed (an interrupted
pack, a partial copy) is refused unless ``allow_partial``; see
:mod:`shardfeed.dataset.unfinished`. Opening through a manifest trusts the manifest's counts
(locally, pack's plan file beside it still means the pack did not finish), not its paths:
every shard it names must lie inside its folder, and its image root inside the folder that
holds that folder, unless ``allow_outside_paths`` (see :mod:`shardfeed.storage.paths`).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardfeed.dataset import unfinished
from shardfeed.errors import FormatError, StorageError, UnsafePathError
from shardfeed.format import spec as S
from shardfeed.format.example import FeatureSpec
from shardfeed.format.manifest import Manifest, dataset_dir, version_file
from shardfeed.storage import files, is_remote
from shardfeed.storage.paths import OPT_IN, UnconfinedRoot, contained, contained_all

SourceArg = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
Features = Mapping[str, FeatureSpec] | Sequence[str] | None

_GLOB_CHARS = re.compile(r"[*?\[]")
_SHARD_NAME = re.compile(
    r"(\.tfrec(ord)?s?($|[.-]))"  # train.tfrecord, x.tfrecords, a.tfrec, b.tfrecord-00001
    r"|(-\d+-of-\d+$)"  # TF's own naming: train-00001-of-01024
    r"|(^part-([rm]-)?\d+($|[.-]))"  # Spark/Hadoop output: part-r-00000, part-00000-<uuid>
)
_NOT_SHARDS = (S.TEXT_INDEX_SUFFIX, S.BINARY_INDEX_SUFFIX, S.TEMP_SUFFIX, ".json", ".npy",
               ".crc")
_SHARD_NAMES_HINT = "*.tfrecord, *-NNNNN-of-NNNNN, part-NNNNN, part-r-NNNNN"


@dataclass(frozen=True, slots=True)
class Resolved:
    """Where the shards are: ``manifest`` (with its ``manifest_url`` and folder ``base``) or
    a plain list of TFRecord ``urls``."""

    urls: tuple[str, ...]
    manifest: Manifest | None = None
    manifest_url: str | None = None
    base: str | None = None


def _is_shard_name(name: str) -> bool:
    """True for names TFRecord writers give their shards. Hadoop/Spark bookkeeping
    (``_SUCCESS``, ``_committed_*``, ``.part-00000.crc``) and hidden files are not shards."""
    base = name.rstrip("/").rsplit("/", 1)[-1]
    if base.startswith((".", "_")) or base.endswith(_NOT_SHARDS):
        return False
    return bool(_SHARD_NAME.search(base))


def is_shard_name(name: str) -> bool:
    """True for the entries of a folder that ``Dataset(folder)`` opens as shards; ``shardfeed
    index``, ``verify`` and ``inspect`` list a folder with this same test."""
    return _is_shard_name(name)


@dataclass(frozen=True, slots=True)
class _Rules:
    """How to open: ``check`` refuses unfinished datasets; ``outside`` lets a manifest name
    paths outside its dataset."""

    check: bool
    outside: bool


def shard_urls(manifest: Manifest, manifest_url: str, *, allow_outside: bool = False
               ) -> tuple[str, ...]:
    """The files the shards of ``manifest`` (read from ``manifest_url``) name, each checked
    to lie inside the manifest's folder, and so (locally) their index files: a link named
    ``x.tfrecord.idx`` leading out of the folder is refused like a shard path."""
    base = dataset_dir(manifest_url)
    where = f"manifest '{manifest_url}'"
    try:
        urls = contained_all(base, [s.path for s in manifest.shards], where=where,
                             what="shard", allow_outside=allow_outside)
    except UnsafePathError as exc:
        raise _spanning_refusal(manifest, base, where) or exc from None
    if not allow_outside and not is_remote(base):
        for url in urls:  # one lstat each: only a link can lead an index out of the folder
            for index in (S.binary_index_path(url), S.text_index_path(url)):
                if os.path.islink(index):
                    contained(base, index, where=where, what="index file of a shard")
    return tuple(urls)


def _shards(count: int) -> str:
    return f"{count} shard" if count == 1 else f"{count} shards"


def _spanning_refusal(manifest: Manifest, base: str, where: str) -> UnsafePathError | None:
    """The refusal of a manifest that names shards both inside its folder and outside it
    (``train/shardfeed.json`` naming ``../val/*``), or None for another refusal.

    Its advice reads only the folder's own shards first; the opt-in is said to read the
    others as part of this dataset (for train and val: validation records in training).
    """
    refused: list[str] = []
    for shard in manifest.shards:
        try:
            contained(base, shard.path, where=where, what="shard")
        except UnsafePathError:
            refused.append(shard.path)
    inside = len(manifest.shards) - len(refused)
    if not refused or inside == 0:
        return None  # a manifest kept away from its shards: the opt-in is what it needs
    named = (f"This manifest names {_shards(inside)} in '{base}' and "
             f"{len(refused)} outside it. ")
    together = (f"allow_outside_paths=True (on the command line: --allow-outside-paths) "
                f"reads all {_shards(len(manifest.shards))} as one dataset, the {len(refused)} "
                "outside included")
    if manifest.mode == "tfrecord":  # what `shardfeed index` writes: indexing again is safe
        advice = (
            f"{named}To read only the ones in '{base}', index that folder on its own: "
            f"`shardfeed index {shlex.quote(base)}` (its manifest then names only its "
            f"files; index each other folder on its own too). Opening it with {together}: "
            "only for a manifest meant to span those folders"
        )
    else:
        advice = (
            f"By default the paths a dataset names must stay inside it. {named}If you "
            f"trust this dataset and the files outside belong to it, {together}"
        )
    try:
        contained(base, refused[0], where=where, what="shard", advice=advice)
    except UnsafePathError as exc:
        return exc
    return None


def _from_manifest(url: str, rules: _Rules) -> Resolved:
    if rules.check:
        unfinished.check_plan_beside(url)
    manifest = Manifest.load(url)
    urls = shard_urls(manifest, url, allow_outside=rules.outside)
    return Resolved(urls=urls, manifest=manifest, manifest_url=url, base=dataset_dir(url))


def _try_manifest(url: str, rules: _Rules) -> Resolved | None:
    """The dataset of the manifest at ``url``, or None if there is no such file.

    One read, no existence check first: on an object store that is one GET.
    """
    try:
        return _from_manifest(url, rules)
    except StorageError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            return None
        raise


def _from_folder(url: str, names: list[str], rules: _Rules) -> Resolved:
    """The shards among ``names``, the entries of the folder ``url`` (sorted by name);
    ``check``: refuse the folder if its dataset is unfinished."""
    shards = [files.join(url, n) for n in names if _is_shard_name(n)]
    if rules.check:
        unfinished.check_folder(url, names)
    if not shards:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise FormatError(
            f"folder '{url}' has no {S.MANIFEST_NAME} and no TFRecord files "
            f"({_SHARD_NAMES_HINT}); it holds: {shown or 'nothing'}. Pass a glob or a list "
            "of the shard files instead"
        )
    return Resolved(urls=tuple(shards))


def _from_remote(url: str, rules: _Rules) -> Resolved:
    """A URL that is neither a glob nor a manifest: a dataset folder (one GET of its
    manifest), a folder of TFRecord files (+ one listing), or one object."""
    if _is_shard_name(url) and not url.endswith("/"):
        return _from_files([url], rules)  # a shard's own URL: no request to know that
    found = _try_manifest(files.join(url, S.MANIFEST_NAME), rules)
    if found is not None:
        return found
    names = files.listdir(url)  # an object lists as nothing; a missing prefix raises
    if not names:
        return _from_files([url.rstrip("/")], rules)
    return _from_folder(url.rstrip("/"), names, rules)


def _from_local(text: str, rules: _Rules) -> Resolved:
    path = text.removeprefix("file://")
    if os.path.isdir(path):
        found = _try_manifest(files.join(text, S.MANIFEST_NAME), rules)
        if found is not None:
            return found
        return _from_folder(text, files.listdir(text), rules)
    if not os.path.exists(path):
        raise StorageError(f"'{text}' does not exist; check the path")
    return _from_files([text], rules)


def _is_glob(text: str) -> bool:
    """True when ``text`` is a pattern: it holds ``*``, ``?`` or ``[`` and no file or
    folder has exactly that name (``exp[1]/ds`` is a folder's name when it exists)."""
    if not _GLOB_CHARS.search(text):
        return False
    if is_remote(text):
        return not files.exists(text)  # one request, only for names that look like globs
    return not os.path.exists(text.removeprefix("file://"))


def _from_glob(pattern: str, rules: _Rules) -> Resolved:
    matches = [m for m in files.glob(pattern) if not m.endswith(_NOT_SHARDS)]
    if not matches:
        raise FormatError(
            f"no files match the pattern '{pattern}', and no file or folder has that name; "
            "check the pattern or the path"
        )
    return _from_files(matches, rules)


def _from_files(urls: Sequence[str], rules: _Rules) -> Resolved:
    """Files named one by one (a list, a glob's matches, one file), checked by folder."""
    if rules.check:
        unfinished.check_folders_of(urls)
    return Resolved(urls=tuple(urls))


def resolve_version(source: SourceArg, version: int | None, *, allow_partial: bool = False,
                    allow_outside_paths: bool = False) -> Resolved:
    """:func:`resolve_source`, at dataset version ``version`` (None: the newest): the newest
    manifest if it is that version, else the manifest the dataset keeps for it
    (``shardfeed.vK.json`` beside it); FormatError naming the versions there are."""
    resolved = resolve_source(source, allow_partial=allow_partial,
                              allow_outside_paths=allow_outside_paths)
    if version is None:
        return resolved
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"version must be an int >= 1 (a dataset version), got {version!r}")
    manifest, base = resolved.manifest, resolved.base
    if manifest is None or base is None:
        raise ValueError(f"version={version}: '{source}' has no manifest, so no versions; "
                         "open it without version=")
    if manifest.dataset_version == version:
        return resolved
    rules = _Rules(check=not allow_partial, outside=allow_outside_paths)
    found = _try_manifest(files.join(base, version_file(version)), rules)
    if found is None or found.manifest is None or found.manifest.dataset_version != version:
        kept = dataset_versions(base, manifest)
        raise FormatError(
            f"dataset '{base}' has no version {version}: it keeps versions "
            f"{', '.join(map(str, kept))} (the newest is {manifest.dataset_version}): "
            "open one of those with version=k, or the newest without version=")
    return found


def version_with(base: str, fingerprint: str) -> int | None:
    """The newest version the dataset folder ``base`` keeps whose shards have
    ``fingerprint`` (:func:`~shardfeed.dataset.fingerprint.manifest_fingerprint`); None."""
    from shardfeed.dataset.fingerprint import manifest_fingerprint

    for version in sorted(_kept_versions(base), reverse=True):
        try:
            manifest = Manifest.load(files.join(base, version_file(version)))
        except (OSError, StorageError, FormatError):
            continue
        if manifest_fingerprint(manifest.shards) == fingerprint:
            return version
    return None


def dataset_versions(base: str, newest: Manifest) -> list[int]:
    """The versions of the dataset in the folder ``base`` (``newest``: its manifest) that can
    be opened, ascending: the newest's and those whose manifests it keeps."""
    return sorted({newest.dataset_version, *_kept_versions(base)})


def _kept_versions(base: str) -> list[int]:
    """The versions whose manifests the dataset folder ``base`` keeps (a listing)."""
    try:
        names = files.listdir(base)
    except (OSError, StorageError):
        return []
    found = []
    for name in names:
        stem = name.rsplit("/", 1)[-1]
        if stem.startswith("shardfeed.v") and stem.endswith(".json"):
            number = stem[len("shardfeed.v"):-len(".json")]
            if number.isdigit() and not number.startswith("0"):
                found.append(int(number))
    return found


def resolve_source(source: SourceArg, *, allow_partial: bool = False,
                   allow_outside_paths: bool = False) -> Resolved:
    """Find the manifest or the shard files ``source`` names.

    Raises :class:`FormatError` when the folder of the files holds a dataset whose writing
    did not finish (see :mod:`shardfeed.dataset.unfinished`), unless ``allow_partial``;
    :class:`~shardfeed.errors.UnsafePathError` when a manifest names a shard outside its
    folder, unless ``allow_outside_paths``. The files the user names (a list, a glob, a
    folder) are the user's choice and are not confined.
    """
    rules = _Rules(check=not allow_partial, outside=allow_outside_paths)
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if not text:
            raise ValueError("Dataset source is an empty string; pass a folder, file or glob")
        if _is_glob(text):
            return _from_glob(text, rules)
        if text.endswith(".json"):
            return _from_manifest(text, rules)
        if is_remote(text):
            return _from_remote(text, rules)
        return _from_local(text, rules)
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
    return _from_files(urls, rules)


def resolve_sources(source: SourceArg, *, allow_partial: bool = False,
                    allow_outside_paths: bool = False) -> Resolved:
    """:func:`resolve_source`, but the items of a list may also be folders and globs (a
    command's several arguments): each is resolved on its own and the files of all of them
    are taken in order (without their manifests). A list of one item is that item."""
    rules = {"allow_partial": allow_partial, "allow_outside_paths": allow_outside_paths}
    if isinstance(source, (str, os.PathLike)) or not isinstance(source, Sequence):
        return resolve_source(source, **rules)
    items: list[Any] = [os.fspath(i) if isinstance(i, (str, os.PathLike)) else i
                        for i in source]
    if len(items) == 1 and isinstance(items[0], str):
        return resolve_source(items[0], **rules)
    urls: list[Any] = []
    for item in items:
        if isinstance(item, str) and (
                _is_glob(item) or os.path.isdir(item.removeprefix("file://"))):
            urls.extend(resolve_source(item, **rules).urls)
        else:
            urls.append(item)  # checked (and refused if not a path) by resolve_source
    return resolve_source(urls, **rules)


def _root_region(base: str) -> str:
    """Where a manifest in the folder ``base`` may put its image root: the folder that holds
    ``base`` (so ``../photos`` beside the dataset, as ``pack`` stores it), but never the
    file system's root or above a bucket: then ``base`` itself."""
    if is_remote(base):
        scheme, _, rest = base.partition("://")
        rest = rest.rstrip("/")
        return f"{scheme}://{rest.rsplit('/', 1)[0]}" if "/" in rest.lstrip("/") else base
    near = os.path.dirname(base)
    return base if near == os.path.dirname(near) else near


def referenced_root(resolved: Resolved, root: str | os.PathLike[str] | None, *,
                    allow_outside_paths: bool = False) -> str | None:
    """The folder referenced image paths are relative to: ``root`` when given (trusted),
    else the manifest's root (a relative root is relative to the manifest's folder, which is
    how ``pack`` stores a root near the dataset: the two can move together), else the
    dataset folder (None for files without a manifest: paths are then relative to the
    working directory).

    A manifest's root must lie inside the folder that holds the dataset folder (``..``,
    ``../photos``; not ``/etc`` nor ``../../..``): else
    :class:`~shardfeed.errors.UnsafePathError`, unless ``allow_outside_paths``. With it, the
    root comes back as an :class:`~shardfeed.storage.paths.UnconfinedRoot` (the working
    directory, made absolute, when there is none), which lets the transforms read record paths
    outside it.
    """
    found: str | None
    base, manifest = resolved.base, resolved.manifest
    if root is not None:
        found = os.fspath(root)
    elif manifest is not None and manifest.root is not None:
        region = _root_region(base) if base else os.curdir
        found = contained(
            region, manifest.root, where=f"manifest '{resolved.manifest_url}'",
            what="image root", allow_outside=allow_outside_paths,
            opt_in=f"pass the image folder yourself (Dataset(..., root=...); verify --root), or "
                   f"{OPT_IN}",
        )
    else:
        found = base
    if allow_outside_paths:
        return UnconfinedRoot(os.path.abspath(os.curdir) if found is None else found)
    return found


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
