"""``pack(..., append=True)``: a dataset grows by new shards and a new manifest version; no
shard it had is read or written again.

::

    dataset/
      shardfeed.json             the newest version (the same document as its shardfeed.vN.json)
      shardfeed.v1.json, ...     every version, never changed once written
      shard-00000.tfrecord ...   version 1's shards
      v2/                        what version 2 added: a pack of its own (plan, resume)
        shard-00000.tfrecord ...
      v2-shard-00000.tfrecord    the same files, hard-linked beside version 1's (what the
                                 manifest names: a read checks one folder, not one a version)
      groups.v2.npy, order.v2.npy    version 2's sidecars (every record of it)

Steps: read the newest version N (``shardfeed.json``) -> reserve ``v{N+1}/`` (one ``mkdir``:
of two appends at once, the second stops here, before it writes anything; on object storage,
which has no such guard, ``v{N+1}-<random>/``, a folder no other append writes) -> pack the new
input into it (a folder of class sub-folders keeps the dataset's class ids; a new class gets
the next one) -> check it against the dataset (mode, group and order keys and units, root,
schema: a difference is named) -> the version's sidecars, for all its records (a group
already there keeps its id: frames appended to a day continue its windows) -> keep version N
as ``shardfeed.vN.json`` -> create ``shardfeed.v{N+1}.json`` (exclusively: a link of a
complete file, or a PUT with ``If-None-Match: *``; of two commits one succeeds, the other is
told and keeps its records) -> replace ``shardfeed.json``. A kill anywhere before the commit leaves version N as it was, read
as before; ``resume=True`` finishes the append (its pack resumes, then the commit). Each
version is a dataset of its own (``Dataset(folder, version=k)``): an epoch of it is an exact
permutation of its records.

Determinism: the version's bytes are a function of the dataset's and the input's. State: the
files above. Memory: the sidecars of one version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from shardfeed.errors import PackError, StorageError
from shardfeed.format import _fileio
from shardfeed.format import spec as S
from shardfeed.format.manifest import (
    DATASET_VERSION_KEY,
    SIDECARS_KEY,
    Manifest,
    ShardInfo,
    load_sidecar,
    save_sidecars,
    version_file,
)
from shardfeed.storage import files, is_remote
from shardfeed.tools.pack.output import PackResult


def append(out: str, pack_into: Callable[[str, Sequence[str] | None], PackResult], *,
           source: Any, resume: bool) -> PackResult:
    """Append to the dataset in ``out`` (a local folder or an object-storage URL):
    ``pack_into(folder, classes)`` packs the new input into ``folder`` (resuming there with
    ``resume``) with the class list ``classes`` (None: the input's own). See the module
    docstring."""
    newest = files.join(out, S.MANIFEST_NAME)
    try:
        base_bytes = _fileio.read_bytes(newest, max_bytes=S.MAX_MANIFEST_BYTES)
    except StorageError:
        if _fileio.exists(newest):
            raise
        raise PackError(f"there is no dataset to append to in '{out}' (no {S.MANIFEST_NAME}): "
                        "pack it first, without --append") from None
    base = Manifest.load(newest, data=base_bytes)
    old = base.dataset_version
    new = old + 1
    if _fileio.exists(files.join(out, version_file(new))):
        return _finish_commit(out, new, resume=resume)
    name = reserve_version(out, new, resume=resume)
    made = pack_into(files.join(out, name), _classes(base, source))
    added = Manifest.load(made.manifest)
    try:
        merged = _merged(out, base, added, name=name, version=new)
    except PackError:  # refused: the version's folder is this append's own, and goes
        files.remove_tree(files.join(out, name))
        raise
    commit_version(out, merged, old=old, new=new, name=name, base=base_bytes)
    return dataclasses.replace(
        made, output=out, manifest=newest, shards=len(merged.shards),
        records=merged.num_records, bytes=sum(s.bytes for s in merged.shards), version=new,
        already_complete=False, added=(added.num_records, len(added.shards)))


def reserve_version(out: str, version: int, *, resume: bool = False) -> str:
    """The folder the new version's shards go to. Local: ``v{version}``, made here (of two
    appends at once, the second stops here, before it writes anything; ``resume`` takes the
    folder of one that was stopped). Object storage has no such guard: ``v{version}-{token}``,
    a folder no other append writes to (two appends at once both upload, the commit keeps one)."""
    if is_remote(out):
        return f"v{version}-{secrets.token_hex(4)}"
    folder = os.path.join(out, f"v{version}")
    try:
        os.mkdir(folder)
    except FileExistsError:
        if not resume:
            raise PackError(
                f"'{folder}' exists: another append to '{out}' is writing version {version}, "
                "or one was stopped. Wait for the other to finish; if it was stopped, run the "
                "same append again with --resume (it finishes that one)") from None
    return f"v{version}"


def _classes(base: Manifest, source: Any) -> list[str] | None:
    """The class list of the appended pack: the dataset's classes, then the input's new ones
    (sorted); None where the dataset has none or the input is no folder of classes."""
    vocabularies = base.extra.get("vocabularies") or {}
    known = vocabularies.get(S.IMAGE_LABEL) if isinstance(vocabularies, Mapping) else None
    if not known or not isinstance(source, (str, os.PathLike)) or not os.path.isdir(source):
        return None
    text = os.fspath(source)
    folders = sorted(e for e in os.listdir(text)
                     if os.path.isdir(os.path.join(text, e)) and not e.startswith("."))
    names = [str(n) for n in known]
    return names + [f for f in folders if f not in set(names)]


def _merged(out: str, base: Manifest, added: Manifest, *, name: str,
            version: int) -> Manifest:
    """The manifest of the new version: ``base``'s shards, then ``added``'s (under ``name``),
    with sidecars for all their records; PackError naming what does not match."""
    _check_matches(out, base, added)
    extra: dict[str, Any] = dict(base.extra)
    for key in ("vocabularies", "order_key_unit", "order_column_unit"):
        if key in added.extra:
            extra[key] = added.extra[key]
    sub_files = [f"{name}/{f}" for f in added.extra.get("pack_files", [])]
    written = [*base.extra.get("pack_files", []), *sub_files, f"{name}/{S.MANIFEST_NAME}",
               version_file(version - 1), version_file(version)]
    sidecars: dict[str, str] = {}
    groups: np.ndarray | None = None
    order: np.ndarray | None = None
    if base.group_key is not None:
        groups, names = _group_ids(out, base, added, name)
        if names:
            extra["group_names"] = names
        sidecars[S.GROUPS_NAME] = f"{name}/groups.v{version}.npy"
    if base.order_key is not None:
        order = np.concatenate([_sidecar(out, base, S.ORDER_NAME),
                                _sidecar(files.join(out, name), added, S.ORDER_NAME)])
        sidecars[S.ORDER_NAME] = f"{name}/order.v{version}.npy"
    if groups is not None:
        _check_groups_continue(out, groups, order, base.num_records, extra.get("group_names"))
    save_sidecars(out, group_ids=groups, order_keys=order, files=sidecars)
    written += list(sidecars.values())
    extra.update({DATASET_VERSION_KEY: version, SIDECARS_KEY: sidecars})
    placed = [_place(out, name, s.path) for s in added.shards]
    extra["pack_files"] = [*written, *(p + ext for p in placed if "/" not in p
                                       for ext in _SHARD_FILES)]
    shards = [*base.shards, *(ShardInfo(path=path, records=s.records, bytes=s.bytes,
                                        crc32c=s.crc32c, records_hash=s.records_hash)
                              for path, s in zip(placed, added.shards))]
    return dataclasses.replace(base, shards=shards, extra=extra)


_SHARD_FILES = ("", ".idx", ".idx.npy")  # a shard and its indexes


def _place(out: str, name: str, path: str) -> str:
    """Where the manifest names a shard of the new version: on local disk, beside the
    dataset's own shards as ``{name}-{path}`` (hard links to the version folder's files: a
    read checks the folders its shards lie in, one ``stat`` a folder, so a hundred appends
    must not make a hundred folders); in its version folder on object storage (nothing
    there is checked by folder) or where the file system has no hard links."""
    if is_remote(out):
        return f"{name}/{path}"
    made: list[str] = []
    for ext in _SHARD_FILES:
        source, target = os.path.join(out, name, path + ext), os.path.join(out, f"{name}-{path}{ext}")
        try:
            os.link(source, target)
            made.append(target)
        except FileExistsError:  # an append resumed after it linked: the same file, or refused
            if not os.path.samefile(source, target):
                raise PackError(f"'{target}' exists and is not this append's shard: move it "
                                "away (pack never writes over a file it did not write)") from None
        except OSError:  # no hard links here: the version folder's own files
            for done in made:
                os.unlink(done)
            return f"{name}/{path}"
    return f"{name}-{path}"


def _check_groups_continue(out: str, groups: np.ndarray, order: np.ndarray | None,
                           before: int, names: Any) -> None:
    """PackError unless every group's records stay together and in order (what windows
    need): a group of the dataset gets new records only if it is its last one, and only
    from its last time on."""
    runs = 1 + int(np.count_nonzero(groups[1:] != groups[:-1])) if len(groups) else 0
    bad = None
    if runs != len(np.unique(groups)):
        reused = sorted(set(groups[:before].tolist()) & set(groups[before:].tolist()))
        bad = next((g for g in reused if g != groups[before - 1]), groups[before])
    elif order is not None and 0 < before < len(groups) and (
            groups[before] == groups[before - 1] and order[before] < order[before - 1]):
        bad = groups[before]
    if bad is not None:
        shown = names[int(bad)] if isinstance(names, list) and 0 <= int(bad) < len(names) else bad
        raise PackError(
            f"the new records of group {shown!r} would not follow its records in '{out}': a "
            "group of the dataset gets new records only if it is its last group, and only "
            "from its last time on (windows read a group's frames in order). Nothing was "
            "added; append them with a new group, or pack the dataset again")


def _check_matches(out: str, base: Manifest, added: Manifest) -> None:
    """PackError unless ``added`` can join ``base``: the same mode, group and order keys and
    units, root, and schema (the first difference named)."""
    differences: list[str] = []
    for what, a, b in (
            ("mode", base.mode, added.mode), ("group key", base.group_key, added.group_key),
            ("order key", base.order_key, added.order_key),
            ("order key unit", base.extra.get("order_column_unit"),
             added.extra.get("order_column_unit")),
            ("root", base.root, added.root)):
        if a != b:
            differences.append(f"its {what} is {b!r} where the dataset's is {a!r}")
    if base.schema is not None and added.schema is not None:
        differences += _schema_differences(base.schema.to_json(), added.schema.to_json())
    kept, new = base.extra.get("vocabularies") or {}, added.extra.get("vocabularies") or {}
    for column, names in kept.items():
        grown = list(new.get(column) or [])
        if grown[:len(names)] != list(names):
            differences.append(
                f"its values of {column!r} are numbered {grown[:6]}... where the dataset's are "
                f"{list(names)[:6]}... (pass classes_from / --classes-from the dataset, so "
                "they keep its numbers)")
    if differences:
        raise PackError(
            f"the new records do not match the dataset in '{out}': {'; '.join(differences)}. "
            "Nothing was added; pack them with the dataset's options and features, or as a "
            "dataset of their own")


def _schema_differences(base: Mapping[str, Any], added: Mapping[str, Any]) -> list[str]:
    """The features of two schema documents that differ, named."""
    a, b = base.get("features") or {}, added.get("features") or {}
    out = [f"feature {k!r} is missing" for k in sorted(set(a) - set(b))]
    out += [f"feature {k!r} is new" for k in sorted(set(b) - set(a))]
    out += [f"feature {k!r} is {b[k]} where the dataset's is {a[k]}"
            for k in sorted(set(a) & set(b)) if a[k] != b[k]]
    for key in sorted((set(base) | set(added)) - {"features"}):
        if base.get(key) != added.get(key):
            out.append(f"the schema's {key} is {added.get(key)!r} where the dataset's is "
                       f"{base.get(key)!r}")
    return out


def _sidecar(folder: str, manifest: Manifest, kind: Literal["groups.npy", "order.npy"]
             ) -> np.ndarray:
    return np.array(load_sidecar(folder, kind, records=manifest.num_records,
                                 file=manifest.sidecar_file(kind)))


def _group_ids(out: str, base: Manifest, added: Manifest, name: str
               ) -> tuple[np.ndarray, list[str]]:
    """Every record's group id in the new version, and the group names by id: the dataset's
    groups keep their ids, a group new to it gets the next one (integer keys are their own
    ids: no names)."""
    names = [str(n) for n in base.extra.get("group_names") or []]
    new_names = [str(n) for n in added.extra.get("group_names") or []]
    base_ids = _sidecar(out, base, S.GROUPS_NAME).astype(np.int64)
    added_ids = _sidecar(files.join(out, name), added, S.GROUPS_NAME).astype(np.int64)
    if not names and not new_names:  # integer group keys: the id is the key's value
        return np.concatenate([base_ids, added_ids]), []
    if not names or not new_names:
        raise PackError(
            f"the dataset in '{out}' and its new records key their groups differently (one by "
            f"integers, the other by names: {(names or new_names)[:3]}...): give the new "
            "records the dataset's group values")
    ids = {n: k for k, n in enumerate(names)}
    for n in new_names:
        if n not in ids:
            ids[n] = len(names)
            names.append(n)
    mapping = np.array([ids[n] for n in new_names], dtype=np.int64)
    return np.concatenate([base_ids, mapping[added_ids]]), names


def commit_version(out: str, merged: Manifest, *, old: int, new: int, name: str,
                   base: bytes) -> None:
    """Keep version ``old`` (``base``, its manifest as read) under its own name, create
    version ``new``'s file (the commit: it fails if another writer created it first), then
    make it the newest."""
    kept = files.join(out, version_file(old))
    if not _fileio.exists(kept):
        with contextlib.suppress(FileExistsError):  # another append kept it meanwhile
            _fileio.create_bytes(kept, base)
    path = files.join(out, version_file(new))
    text = merged.to_bytes(path)
    try:
        _fileio.create_bytes(path, text)
    except FileExistsError:
        if _fileio.read_bytes(path, max_bytes=S.MAX_MANIFEST_BYTES) != text:  # not a retry of
            # our own PUT whose answer was lost: another writer's version
            if is_remote(out):  # the folder is this append's alone, and nothing reads it
                files.remove_tree(files.join(out, name))
                where = "run this append again"
            else:
                where = ("its shards went to the folder the other one committed: leave it, "
                         "and run this append again without --resume")
            raise PackError(
                f"another append committed version {new} of '{out}' first; your input was not "
                f"added ({where}; it becomes the next version)") from None
    _fileio.write_bytes_atomic(files.join(out, S.MANIFEST_NAME), text)


def _finish_commit(out: str, new: int, *, resume: bool) -> PackResult:
    """Version ``new`` was committed but ``shardfeed.json`` not yet replaced (a kill between
    the two): with ``resume``, replace it."""
    committed = files.join(out, version_file(new))
    if not resume:
        raise PackError(f"an append to '{out}' was stopped while it committed version {new} "
                        "(its shardfeed.json still names the version before): run it again with "
                        "--resume to finish that commit; this input was not appended")
    text = _fileio.read_bytes(committed)
    manifest = Manifest.from_json(json.loads(text), where=committed)
    _fileio.write_bytes_atomic(files.join(out, S.MANIFEST_NAME), text)
    return PackResult(output=out, manifest=files.join(out, S.MANIFEST_NAME),
                      shards=len(manifest.shards), records=manifest.num_records,
                      bytes=sum(s.bytes for s in manifest.shards), kept_shards=0,
                      version=new)


__all__ = ["append", "commit_version", "reserve_version"]
