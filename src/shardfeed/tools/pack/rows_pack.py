"""``pack`` of data (arrays, rows, tables, tar and Parquet files) on one machine: one
partition through the partition writer, then the merge (:mod:`shardfeed.tools.pack.partition`),
so that a cluster pack of the same rows in order gives the same records in the same order."""

from __future__ import annotations

import os
from typing import Any

from shardfeed.errors import PackError
from shardfeed.format import spec
from shardfeed.storage import files
from shardfeed.tools.pack.output import PackResult
from shardfeed.tools.pack.partition import (
    PARTS_FOLDER,
    PartSizes,
    clear_unfinished,
    merge_partitions,
    remove_parts,
    write_partition,
)
from shardfeed.tools.pack.rows import RowFields, located, paths_of, table_rows
from shardfeed.tools.pack.tables import label_vocabularies
from shardfeed.tools.pack.tars import is_tar, tar_fields, tar_rows, tars_name


def pack_rows(source: Any, out: str, *, fields: RowFields | None, options: Any,
              overwrite: bool, resume: bool, progress: bool,
              root: str | os.PathLike[str] | None = None) -> PackResult:
    """Pack the rows of ``source`` into ``out`` (see :func:`shardfeed.pack`); ``root``: the
    folder image paths in the data are read under (as ``RowFields(root=...)``)."""
    from tqdm import tqdm

    if resume:
        raise ValueError("resume applies to folder, CSV and TFRecord inputs; a pack of data "
                         "is written again from the start (pass overwrite=True)")
    if options.mode != "embedded":
        raise ValueError("mode applies to folder and CSV inputs; for data, choose how pixel "
                         "arrays are stored with RowFields(encode='png'|'jpeg'|'raw')")
    prepare_output(out, overwrite=overwrite)
    paths = paths_of(source)
    if paths is not None and all(is_tar(p) for p in paths):
        fields = _with_root(tar_fields(fields), root)  # the key is the record's name
        rows, where = tar_rows(paths, fields, max_pixels=options.max_pixels), tars_name(paths)
        vocabularies: dict[str, list[str]] = {}
    else:
        fields = _with_root(fields or RowFields(), root)
        table = table_rows(source, fields, max_pixels=options.max_pixels)
        rows, where, vocabularies = table.rows, table.where, table.vocabularies
    sizes = PartSizes(records=options.records_per_shard, bytes=options.shard_bytes)
    try:
        with tqdm(unit="img", desc="pack", disable=not progress) as bar:
            def counted() -> Any:
                for row in located(rows, where):
                    yield row
                    bar.update(1)

            partial = write_partition(counted(), out, partition=0, fields=fields, sizes=sizes,
                                      attempt="local", workers=options.workers,
                                      max_pixels=options.max_pixels, where=f"{where}: row")
        if not partial.shards:
            raise PackError(f"{where} holds no rows; there is nothing to pack")
        names = label_vocabularies(vocabularies, fields)  # complete now: every row was read
        manifest = merge_partitions(out, [partial], prefix=options.prefix,
                                    extra={"vocabularies": names} if names else None)
    except BaseException:
        remove_parts(out)
        raise
    return PackResult(output=out, manifest=manifest, shards=len(partial.shards),
                      records=partial.records, bytes=sum(s.bytes for s in partial.shards),
                      kept_shards=0)


def _with_root(fields: RowFields, root: str | os.PathLike[str] | None) -> RowFields:
    """``fields`` with the folder image paths are read under: ``root`` or its own."""
    import dataclasses

    if root is None:
        given = fields.root
    elif fields.root is not None and os.path.abspath(fields.root) != os.path.abspath(root):
        raise ValueError(f"two roots were given: root={os.fspath(root)!r} and "
                         f"RowFields(root={fields.root!r}); give one")
    else:
        given = os.fspath(root)
    if given is not None and not os.path.isdir(given):
        raise ValueError(f"root {given!r} is not a folder; name the folder that holds the "
                         "images the data names")
    return dataclasses.replace(fields, root=given)


def check_empty(out: str, *, overwrite: bool = False) -> bool:
    """Create ``out`` if missing (a local folder, or an object-storage prefix); True when it
    holds something (a parts folder aside): a PackError unless ``overwrite``."""
    if not files.is_remote(out):
        if os.path.exists(out) and not os.path.isdir(out):
            raise PackError(f"output '{out}' is a file; name a folder (it is created if "
                            "missing)")
        os.makedirs(out, exist_ok=True)
    entries = files.listdir(out) if files.exists(out) else []
    entries = [e for e in entries if e != PARTS_FOLDER]
    if entries and not overwrite:
        raise PackError(f"output folder '{out}' is not empty ({len(entries)} entries); pass "
                        "--overwrite (overwrite=True) to replace what an earlier pack wrote "
                        "there, or choose an empty folder")
    return bool(entries)


def prepare_output(out: str, *, overwrite: bool) -> None:
    """An empty (or new) output folder; ``overwrite``: what an earlier pack wrote there (its
    manifest names it) is removed first, and nothing else. What a pack in parts left when it
    stopped mid-merge is removed in any case (:func:`clear_unfinished`)."""
    clear_unfinished(out)
    if not check_empty(out, overwrite=overwrite):
        return
    from shardfeed.format.manifest import Manifest

    manifest = files.join(out, spec.MANIFEST_NAME)
    if not files.exists(manifest):
        raise PackError(f"output folder '{out}' holds no shardfeed dataset (no "
                        f"{spec.MANIFEST_NAME}); overwrite removes only what a pack wrote: "
                        "choose an empty folder")
    old = Manifest.load(manifest)
    names = list(old.extra.get("pack_files", []))
    names += [n for s in old.shards for n in (s.path, spec.text_index_path(s.path),
                                              spec.binary_index_path(s.path))]
    files.remove(manifest)  # first: from here on the folder no longer reads as a dataset
    for name in sorted({*names, spec.GROUPS_NAME, spec.ORDER_NAME}):
        if _plain_name(name):  # only files of this folder, never a path out of it
            files.remove(files.join(out, name), missing_ok=True)


def _plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and os.sep not in name


__all__ = ["check_empty", "pack_rows", "prepare_output"]
