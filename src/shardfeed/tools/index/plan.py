"""Where ``shardfeed index`` writes its manifests, and which files each one names.

A folder's ``shardfeed.json`` is what ``Dataset(folder)`` opens, so ``index`` writes one
manifest a folder, naming only that folder's files; a manifest over several folders is
written only where the user names it, and never as the own manifest of another folder of
TFRecord files (its dataset would take the other folders' records as its own)::

    shardfeed index train/ val/                      train/shardfeed.json  names train/*
                                                     val/shardfeed.json    names val/*
    shardfeed index train/ val/ --manifest all.json  all.json              names train/*, val/*
    shardfeed index train/ val/ --manifest train/    refused: Dataset("train/") would read val/*

Shard names in a manifest are relative to its folder when below it (``../x`` otherwise,
which a reader takes only with ``allow_outside_paths``). Determinism: the plan depends on the
paths only, and, for a manifest the user names ``shardfeed.json``, one listing of its folder.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from shardfeed.errors import StorageError
from shardfeed.format import spec
from shardfeed.storage import files as storage_files
from shardfeed.storage import is_remote
from shardfeed.tools import discovery


@dataclass(frozen=True, slots=True)
class ManifestPlan:
    """One manifest to write: its ``path``, its folder ``base``, the ``files`` it names (as
    given, in input order) and their ``names`` in it."""

    path: str
    base: str
    files: tuple[str, ...]
    names: tuple[str, ...]


def _folder(path: str) -> str:
    """The folder a file lies in, as its manifest's folder is written."""
    if is_remote(path):
        return posixpath.dirname(path)
    return os.path.dirname(os.path.abspath(path))


def _manifest_path(first: str, manifest: str | os.PathLike[str] | None) -> str:
    """Where the manifest goes: ``manifest`` (a file or folder), else beside ``first``."""
    if manifest is None:
        folder = _folder(first)
        return posixpath.join(folder, spec.MANIFEST_NAME) if is_remote(first) \
            else os.path.join(folder, spec.MANIFEST_NAME)
    text = os.fspath(manifest)
    if is_remote(text):
        return text if text.endswith(".json") else storage_files.join(text, spec.MANIFEST_NAME)
    path = os.path.abspath(text)
    return os.path.join(path, spec.MANIFEST_NAME) if os.path.isdir(path) else path


def _base(manifest_path: str) -> str:
    if is_remote(manifest_path):
        return posixpath.dirname(manifest_path)
    return os.path.dirname(manifest_path)


def _relative(path: str, base: str) -> str:
    """``path`` as the manifest names it: relative to ``base`` when below it."""
    if is_remote(path) or is_remote(base):
        prefix = base.rstrip("/") + "/"
        return path.removeprefix(prefix)
    return os.path.relpath(os.path.abspath(path), base)


def _under(path: str, base: str) -> bool:
    """True when the file ``path`` lies in the folder ``base`` or below it."""
    if is_remote(path) or is_remote(base):
        return path.startswith(base.rstrip("/") + "/")
    return os.path.abspath(path).startswith(base.rstrip(os.sep) + os.sep)


def _holds_shards(folder: str) -> bool:
    """True when ``folder`` holds TFRecord files (as ``Dataset(folder)`` lists them)."""
    try:
        names = storage_files.listdir(folder)
    except StorageError as exc:
        if isinstance(exc.__cause__, (FileNotFoundError, NotADirectoryError)):
            return False
        raise
    return any(discovery.is_shard_name(n) for n in names)


def _plan(path: str, files: Sequence[str]) -> ManifestPlan:
    base = _base(path)
    return ManifestPlan(path=path, base=base, files=tuple(files),
                        names=tuple(_relative(f, base) for f in files))


def _check_named(path: str, files: Sequence[str]) -> None:
    """Refuse to write, as a folder's own manifest, one that names files outside the folder
    when the folder holds TFRecord files of its own (``Dataset(folder)`` would read them all
    as one dataset)."""
    if posixpath.basename(path.replace(os.sep, "/")) != spec.MANIFEST_NAME:
        return
    base = _base(path)
    outside = [f for f in files if not _under(f, base)]
    if not outside or not _holds_shards(base):
        return
    if any(is_remote(f) for f in files):
        name = "a name such as all.json"
    else:
        common = os.path.commonpath([_folder(f) for f in files])
        name = f"--manifest {os.path.join(common, 'all.json')}"
    raise ValueError(
        f"manifest '{path}' is the one Dataset('{base}') opens, and the files to index "
        f"include {len(outside)} outside '{base}' (the first: '{outside[0]}'): that "
        "folder's dataset would read them as its own. Index without --manifest (manifest=None) to "
        "write one manifest in each folder, naming only its files; for one dataset over "
        f"all of them, give its manifest a file name of its own ({name}) and open it by "
        "that path"
    )


def plan_manifests(
    files: Sequence[str], manifest: str | os.PathLike[str] | None
) -> list[ManifestPlan]:
    """The manifests to write for ``files``: one a folder (each at ``FOLDER/shardfeed.json``,
    folders in the order their first file comes), or the one ``manifest`` names over all of
    them. Raises ``ValueError`` for a ``manifest`` that is a folder's own (``shardfeed.json``)
    naming files outside that folder, when the folder holds TFRecord files of its own."""
    if manifest is not None:
        path = _manifest_path(files[0], manifest)
        _check_named(path, files)
        return [_plan(path, files)]
    by_folder: dict[str, list[str]] = {}
    for f in files:
        by_folder.setdefault(_folder(f), []).append(f)
    return [_plan(_manifest_path(group[0], None), group) for group in by_folder.values()]


__all__ = ["ManifestPlan", "plan_manifests"]
