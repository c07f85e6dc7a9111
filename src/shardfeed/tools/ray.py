"""shardfeed on a Ray cluster: pack a Ray Dataset, index and verify TFRecord files as tasks.

::

    ds = ray.data.read_parquet("s3://lake/export/")        # any Ray Dataset of rows
    pack_ray(ds, "/data/packed", fields=RowFields(image="jpeg", labels=["label"]))

    write task i (any node, any attempt)   --> _parts/i-attempt/part-K.tfrecord (+ indexes)
    driver, once every task finished        --> merge: one dataset, manifest last

:class:`PackSink` is a ``ray.data.Datasink``: each write task runs the partition writer
(:mod:`shardfeed.tools.pack.partition`) on its blocks with the task's index as partition id;
``on_write_complete`` merges what finished tasks returned. With ``preserve_order`` the
records' order is the Dataset's, whatever ran where: the same records, in the same order, as
``shardfeed.pack`` of the same rows on one machine. A Dataset executes with the
``DataContext`` it copied when it was made, so :func:`pack_ray` sets ``preserve_order`` on
the Dataset's own context for the write (and puts the old value back), never on the current
one, which the Dataset no longer reads: the first pack of a session is ordered like every
other. A task killed mid-write is retried by Ray; what it left is under its own attempt
folder, which the merge removes. A driver killed mid-merge leaves a folder that readers
refuse; the next ``pack_ray`` into it removes what the merge left (see
:func:`shardfeed.tools.pack.partition.clear_unfinished`) and packs again.
:func:`ray_map` runs ``index_files`` and ``verify`` one file per Ray task (``run=ray_map``).

The output is a folder every node can reach: an object-storage URL (``s3://bucket/ds``; give
the sink its ``storage_options`` when the nodes do not have them from their environment) or
a shared file system.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import ray
from ray.data import Datasink
from ray.data.block import BlockAccessor

from shardfeed.errors import PackError
from shardfeed.storage import is_remote
from shardfeed.storage.files import storage_scope
from shardfeed.storage.options import set_storage_options
from shardfeed.tools.pack.partition import (
    Partial,
    PartSizes,
    merge_partitions,
    remove_parts,
    write_partition,
)
from shardfeed.tools.pack.plan import parse_size
from shardfeed.tools.pack.rows import RowFields

T = TypeVar("T")
R = TypeVar("R")


class PackSink(Datasink[dict[str, Any]]):
    """Packs a Ray Dataset into ``output`` (see the module docstring); after the write,
    ``manifest`` is the path of the dataset's manifest. ``storage_options`` (fsspec options
    of an object-storage ``output``) are set in every task before it writes. ``overwrite``:
    what an earlier pack wrote in ``output`` (its manifest names it) is removed first.

    Write it with the Dataset's ``execution_options.preserve_order`` set (as
    :func:`pack_ray` does): else the records' order is whichever order the blocks reached
    the write tasks in, which changes from run to run."""

    def __init__(self, output: str | os.PathLike[str], *, fields: RowFields | None = None,
                 sizes: PartSizes | None = None, prefix: str = "shard",
                 verify: bool = True, storage_options: Mapping[str, Any] | None = None,
                 overwrite: bool = False) -> None:
        text = os.fspath(output)
        self.output = text.rstrip("/") if is_remote(text) else os.path.abspath(text)
        self.fields = fields or RowFields()
        self.sizes = sizes or PartSizes(bytes=64 << 20)
        self.prefix = prefix
        self.verify = verify
        self.storage_options = dict(storage_options or {})
        self.overwrite = overwrite
        self.manifest: str | None = None

    def _options(self) -> None:
        if self.storage_options:
            set_storage_options(self.output + "/", **self.storage_options)

    def on_write_start(self, schema: Any = None) -> None:
        from shardfeed.tools.pack.rows_pack import prepare_output

        self._options()
        prepare_output(self.output, overwrite=self.overwrite)
        remove_parts(self.output)

    def write(self, blocks: Iterable[Any], ctx: Any) -> dict[str, Any]:
        self._options()
        rows = _rows_of(blocks)
        partial = write_partition(rows, self.output, partition=int(ctx.task_idx),
                                  fields=self.fields, sizes=self.sizes,
                                  attempt=uuid.uuid4().hex[:12])
        return partial.to_json()

    def on_write_complete(self, write_result: Any) -> None:
        partials = [Partial.from_json(p) for p in write_result.write_returns]
        if not partials:
            raise PackError(f"the Ray Dataset packed into '{self.output}' has no rows")
        self.manifest = merge_partitions(self.output, partials, prefix=self.prefix,
                                         verify=self.verify,
                                         partitions=1 + max(p.partition for p in partials))

    def on_write_failed(self, error: Exception) -> None:
        remove_parts(self.output)

    def get_name(self) -> str:
        return "shardfeed"


def _rows_of(blocks: Iterable[Any]) -> Iterator[Mapping[str, Any]]:
    for block in blocks:
        rows: Iterable[Mapping[str, Any]] = BlockAccessor.for_block(block).iter_rows(
            public_row_format=True)
        yield from rows


def pack_ray(dataset: Any, output: str | os.PathLike[str], *,
             fields: RowFields | None = None, shard_size: int | str | None = None,
             records_per_shard: int | None = None, prefix: str = "shard",
             verify: bool = True, concurrency: int | None = None,
             storage_options: Mapping[str, Any] | None = None, overwrite: bool = False,
             append: bool = False, resume: bool = False) -> str:
    """Pack ``dataset`` (a ``ray.data.Dataset`` of rows) into the empty folder ``output``
    with one partition a write task, in the Dataset's order; return the manifest's path.

    Args:
        shard_size, records_per_shard: where each partition's shards are cut (default
            64 MB). With ``records_per_shard`` a divisor of every partition's rows, the
            shards are those of ``shardfeed.pack`` of the same rows, and so its fingerprint.
        verify: the merge reads every part back against its CRC32C.
        storage_options: see :class:`PackSink`.
        overwrite: remove what an earlier pack wrote in ``output`` first (its manifest names
            it; other files stay).
        append: add the rows to the dataset in ``output`` as its next
            version (see ``shardfeed.pack(..., append=True)``); ``resume``: finish such an
            append that was stopped (its version folder is packed again, then committed).

    Raises:
        TypeError: ``dataset`` is not a ``ray.data.Dataset``.
        PackError: ``output`` holds files that no pack wrote there (or, without
            ``overwrite``, an earlier dataset), a bad row (its partition and position named).

    What a pack whose driver was killed mid-merge left in ``output`` is removed first; a
    rerun of the same call finishes the pack.
    """
    if not isinstance(dataset, ray.data.Dataset):
        raise TypeError(f"pack_ray packs a ray.data.Dataset (e.g. ray.data.read_parquet(...)), "
                        f"got {type(dataset).__name__}; for rows in memory use shardfeed.pack")
    if append:
        return _append(dataset, os.fspath(output), resume=resume, overwrite=overwrite,
                       fields=fields, shard_size=shard_size, records_per_shard=records_per_shard,
                       prefix=prefix, verify=verify, concurrency=concurrency,
                       storage_options=storage_options)
    if shard_size is None and records_per_shard is None:
        shard_size = "64MB"
    sizes = PartSizes(records=records_per_shard,
                      bytes=parse_size(shard_size) if shard_size is not None else None)
    sink = PackSink(output, fields=fields, sizes=sizes, prefix=prefix, verify=verify,
                    storage_options=storage_options, overwrite=overwrite)
    # the Dataset runs with the context it copied when it was made, not the current one
    options = dataset.context.execution_options
    before = options.preserve_order
    options.preserve_order = True  # the records' order is the Dataset's
    try:
        dataset.write_datasink(sink, concurrency=concurrency)
    finally:
        options.preserve_order = before
    assert sink.manifest is not None
    return sink.manifest


def _append(dataset: Any, output: str, *, resume: bool, overwrite: bool,
            **options: Any) -> str:
    """:func:`pack_ray` of ``dataset`` as the next version of the dataset in ``output``."""
    from shardfeed.format.manifest import Manifest
    from shardfeed.tools.pack.append import append
    from shardfeed.tools.pack.output import PackResult

    if overwrite:
        raise ValueError("append and overwrite exclude each other: append adds a version and "
                         "keeps every record there; overwrite replaces them")
    def pack_into(folder: str, classes: Sequence[str] | None) -> PackResult:
        path = pack_ray(dataset, folder, overwrite=resume, **options)
        made = Manifest.load(path)
        return PackResult(output=folder, manifest=path, shards=len(made.shards),
                          records=made.num_records, bytes=sum(s.bytes for s in made.shards),
                          kept_shards=0)

    where = output if is_remote(output) else os.path.abspath(output)
    with storage_scope(options.get("storage_options")):
        return append(where, pack_into, source=None, resume=resume).manifest


def ray_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(x) for x in items]``, each call a Ray task, results in input order: the
    ``run=`` of ``index_files`` and ``verify``."""
    task: Any = ray.remote(_call)
    return list(ray.get([task.remote(fn, item) for item in items]))


def _call(fn: Callable[[T], R], item: T) -> R:
    return fn(item)


__all__ = ["PackSink", "pack_ray", "ray_map"]
