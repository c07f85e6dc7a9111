"""``index``: make existing TFRecord files (TensorFlow, Spark, Beam) a shardfeed dataset.

For each file, in parallel: scan the record offsets (length CRCs checked), write ``.idx``
(DALI's format) and ``.idx.npy`` beside it, and optionally read every record's group and
order features. Then write a ``shardfeed.json`` in each folder of the files, naming only that
folder's files (or one manifest over all of them at ``manifest=``; see
:mod:`shardfeed.tools.index.plan`), with the shards, their sizes and CRC32C checksums, an
inferred schema and the ``groups.npy`` / ``order.npy`` sidecars, so
``shardfeed.Dataset(folder)`` opens them. A folder is listed
exactly as ``Dataset(folder)`` lists it (``*.tfrecord``, ``*-00001-of-00010``, Spark/Hadoop
``part-r-00000``; never ``_SUCCESS`` or ``*.crc``).

The order key's unit is given (``time_unit="s"``, ``"ms"``, ``"us"``, ``"ns"``) or detected
(``"auto"``): values that are all Unix times in one unit are read in that unit (so the int64
nanoseconds ``shardfeed pack`` writes, and epoch milliseconds, come out right); values that
are no Unix times at all are read as seconds; a mix is refused. ``order.npy`` holds float64
seconds.

Object storage works the same: ``index_files("s3://bucket/train/*.tfrecord")`` reads each
object by byte ranges and writes the indexes and the manifest (last) into the bucket.

GZIP/ZLIB files are refused (records cannot be read by offset) with the conversion hint.
Determinism: output depends on the files only. Memory: 8 bytes a record, plus one read block
per worker.
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import numpy as np

from shardfeed.dataset import unfinished
from shardfeed.errors import FormatError, SchemaError, location
from shardfeed.format import spec
from shardfeed.format.records_hash import hash_of_shard
from shardfeed.storage import files as storage_files
from shardfeed.storage import is_remote
from shardfeed.storage.base import ByteSource
from shardfeed.tools import discovery
from shardfeed.tools.index.plan import plan_manifests
from shardfeed.tools.pack import time as packtime
from shardfeed.tools.pack.workers import Runner, no_progress

IndexTimeUnit = Literal["auto", "s", "ms", "us", "ns"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IndexedFile:
    """One indexed file: its ShardInfo and (when asked) per-record group and order values."""

    info: Any
    groups: list[int | str] | None
    orders: list[float] | None


@dataclass(frozen=True, slots=True)
class IndexedManifest:
    """One manifest ``index_files`` wrote: its path, the files it names and their totals."""

    manifest: str
    files: int
    records: int
    bytes: int
    paths: tuple[str, ...] = ()
    order_unit: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A plain summary of this manifest."""
        return {
            "manifest": self.manifest, "files": self.files, "records": self.records,
            "bytes": self.bytes, "paths": list(self.paths), "order_unit": self.order_unit,
        }


@dataclass(frozen=True, slots=True)
class IndexResult:
    """What ``index_files`` wrote: ``manifests``, one a folder of the files (or the one
    asked for), and totals over them all."""

    manifests: tuple[IndexedManifest, ...]

    @property
    def manifest(self) -> str:
        """The manifest written, when there is one; with files in several folders (one
        manifest each) read ``manifests`` instead."""
        if len(self.manifests) != 1:
            raise ValueError(
                f"{len(self.manifests)} manifests were written, one a folder "
                f"({', '.join(m.manifest for m in self.manifests)}); read result.manifests"
            )
        return self.manifests[0].manifest

    @property
    def files(self) -> int:
        """Files indexed, in every manifest."""
        return sum(m.files for m in self.manifests)

    @property
    def records(self) -> int:
        """Records in every file indexed."""
        return sum(m.records for m in self.manifests)

    @property
    def bytes(self) -> int:
        """Bytes of every file indexed."""
        return sum(m.bytes for m in self.manifests)

    @property
    def paths(self) -> tuple[str, ...]:
        """The files indexed, manifest by manifest."""
        return tuple(p for m in self.manifests for p in m.paths)

    @property
    def order_unit(self) -> str | None:
        """The unit order keys were read in, when every manifest read them in one unit."""
        units = {m.order_unit for m in self.manifests}
        return units.pop() if len(units) == 1 else None

    def to_json(self) -> dict[str, Any]:
        """A plain summary (``shardfeed index --json``): the totals, ``manifest`` (null when
        several were written) and each manifest in ``manifests``."""
        return {
            "ok": True,
            "manifest": self.manifests[0].manifest if len(self.manifests) == 1 else None,
            "files": self.files, "records": self.records, "bytes": self.bytes,
            "paths": list(self.paths), "order_unit": self.order_unit,
            "manifests": [m.to_json() for m in self.manifests],
        }


def _scalar(value: Any, *, key: str, where: str) -> int | float | str:
    if isinstance(value, np.ndarray) and value.size == 1:
        item = value.reshape(-1)[0]
        return int(item) if value.dtype.kind in "iu" else float(item)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise SchemaError(
        f"{where}: feature {key!r} must hold exactly one value to be a group or order key, "
        f"got {value!r}; choose another feature"
    )


def _index_one(
    path: str, name: str, *, group_key: str | None, order_key: str | None,
    advance: Any,
) -> IndexedFile:
    from shardfeed.format.framing import scan
    from shardfeed.format.index import write_binary_index, write_text_index
    from shardfeed.format.manifest import ShardInfo
    from shardfeed.storage import open_source

    if not is_remote(path) and not os.path.isfile(path):
        raise FormatError(f"file '{path}' does not exist; check the path")
    src = open_source(path)
    try:
        offsets = scan(src, progress=advance)
        if offsets.size == 1:
            log.warning("file '%s' is empty (no records)", path)
        write_text_index(spec.text_index_path(path), offsets)
        write_binary_index(spec.binary_index_path(path), offsets)
        size = int(offsets[-1])
        crc = _file_crc(src, size)
        groups: list[int | str] | None = [] if group_key else None
        orders: list[float] | None = [] if order_key else None
        if groups is not None or orders is not None:
            _read_keys(src, size, ((group_key, groups), (order_key, orders)))
    finally:
        src.close()
    info = ShardInfo(path=name, records=int(offsets.size - 1), bytes=size, crc32c=crc,
                     records_hash=None if is_remote(path) else hash_of_shard(path, offsets))
    return IndexedFile(info=info, groups=groups, orders=orders)


def _file_crc(src: ByteSource, size: int) -> int:
    """The CRC32C of the first ``size`` bytes, read in 8 MiB blocks."""
    import google_crc32c

    crc = pos = 0
    while pos < size:
        chunk = src.read(pos, min(8 << 20, size - pos))
        crc = int(google_crc32c.extend(crc, chunk))
        pos += len(chunk)
    return crc


def _read_keys(
    src: ByteSource, size: int, wanted: tuple[tuple[str | None, list[Any] | None], ...]
) -> None:
    """Append each record's value of every ``(key, out)`` in ``wanted`` with a key to ``out``,
    reading the records with :func:`shardfeed.format.walk.walk` (data CRCs checked)."""
    from shardfeed.format.example import decode_example
    from shardfeed.format.framing import status_error
    from shardfeed.format.walk import walk

    path = src.url
    for status in walk(src, size=size, data="payload"):
        if status.payload is None:
            raise status_error(src, status, size)
        where = location(path, status.record, status.offset)
        rec = decode_example(status.payload, where=where)
        for key, out in wanted:
            if key is None or out is None:
                continue
            if key not in rec:
                raise SchemaError(
                    f"{where}: the record has no feature {key!r} (it has "
                    f"{', '.join(sorted(rec))}); choose another key"
                )
            out.append(_scalar(rec[key], key=key, where=where))


def _group_ids(values: list[int | str], key: str) -> tuple[np.ndarray, list[str] | None]:
    """int64 group ids: the values themselves when all are integers, else sorted ranks."""
    if all(isinstance(v, int) for v in values):
        return np.asarray(values, dtype=np.int64), None
    if any(isinstance(v, float) for v in values):
        raise SchemaError(
            f"group key {key!r} holds floats; a group key must be an integer or a string"
        )
    names = sorted({str(v) for v in values})
    rank = {n: i for i, n in enumerate(names)}
    return np.asarray([rank[str(v)] for v in values], dtype=np.int64), names


def _size(path: str) -> int:
    if is_remote(path):
        return storage_files.size(path)
    return os.path.getsize(path) if os.path.isfile(path) else 0


def index_files(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    manifest: str | os.PathLike[str] | None = None,
    group_key: str | None = None,
    order_key: str | None = None,
    workers: int = 1,
    progress: bool = False,
    time_unit: IndexTimeUnit = "auto",
    run: Runner | None = None,
) -> IndexResult:
    """Index TFRecord files and write their manifests; see the module docstring.

    ``inputs``: files, folders of them or globs. ``manifest``: where one manifest over all
    the files goes (a ``.json`` path or a folder); by default each folder of the files gets
    its own ``shardfeed.json``, naming only its files (see :mod:`shardfeed.tools.index.plan`).
    Shard paths in a manifest are relative to its folder.
    ``group_key``/``order_key``: features read from every record into ``groups.npy`` /
    ``order.npy`` (string group values get ids by sorted rank; the names go into the
    manifest's ``extra``). ``time_unit``: the order key's unit (see the module docstring).
    ``run(fn, files) -> results``: how the files are spread (default: ``workers`` threads
    here; :func:`shardfeed.tools.ray.ray_map`: a Ray task a file, no progress bar).

    Raises:
        ValueError: a bad argument, or a ``manifest`` that is a folder's own
            ``shardfeed.json`` while files outside that folder are indexed (and it holds
            TFRecord files of its own): ``Dataset(folder)`` would read them as its own.
    """
    _check_arguments(workers=workers, order_key=order_key, time_unit=time_unit)
    files = discovery.expand_inputs(inputs)
    # A manifest over the shards of a pack that did not finish would make them look whole.
    unfinished.check_folders_of(files)
    plans = plan_manifests(files, manifest)
    pairs = [(f, n) for plan in plans for f, n in zip(plan.files, plan.names)]
    if run is not None:
        one = partial(_index_pair, group_key=group_key, order_key=order_key)
        results = list(run(one, pairs))
    else:
        results = _index_all(pairs, group_key=group_key, order_key=order_key,
                             workers=workers, progress=progress)
    written: list[IndexedManifest] = []
    start = 0
    for plan in plans:
        mine = results[start:start + len(plan.files)]
        start += len(plan.files)
        done = _write_index_manifest(plan.base, plan.path, mine, group_key=group_key,
                                     order_key=order_key, time_unit=time_unit)
        written.append(IndexedManifest(
            manifest=done.path, files=len(done.shards),
            records=sum(s.records for s in done.shards),
            bytes=sum(s.bytes for s in done.shards), paths=plan.files,
            order_unit=done.order_unit,
        ))
    return IndexResult(manifests=tuple(written))


def _index_pair(pair: tuple[str, str], *, group_key: str | None,
                order_key: str | None) -> IndexedFile:
    return _index_one(pair[0], pair[1], group_key=group_key, order_key=order_key,
                      advance=no_progress)


def _check_arguments(*, workers: int, order_key: str | None, time_unit: IndexTimeUnit) -> None:
    """Refuse a bad ``workers`` or ``time_unit``, and a time unit without an order key."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    packtime.check_time_unit(time_unit, allowed=("auto", "s", "ms", "us", "ns"))
    if time_unit != "auto" and order_key is None:
        raise ValueError(
            f"time_unit={time_unit!r} was given without an order key; name it with order_key= "
            "(--order-key)"
        )


def _index_all(
    pairs: Sequence[tuple[str, str]], *, group_key: str | None, order_key: str | None,
    workers: int, progress: bool,
) -> list[IndexedFile]:
    """Index every ``(file, name)`` (``workers`` threads, one progress bar in bytes), in
    order."""
    total = sum(_size(f) for f, _name in pairs)
    from tqdm import tqdm

    lock = threading.Lock()
    with tqdm(total=total, unit="B", unit_scale=True, desc="index", disable=not progress) as bar:
        def advance(n: int) -> None:
            with lock:
                bar.update(n)

        def one(pair: tuple[str, str]) -> IndexedFile:
            return _index_one(pair[0], pair[1], group_key=group_key, order_key=order_key,
                              advance=advance)

        if workers == 1:
            return [one(p) for p in pairs]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, pairs))


@dataclass(frozen=True, slots=True)
class _Written:
    """The manifest written, the shards it names and the unit order keys were read in."""

    path: str
    shards: list[Any]
    order_unit: str | None


def _write_index_manifest(
    base: str, manifest_path: str, results: Sequence[IndexedFile], *, group_key: str | None,
    order_key: str | None, time_unit: IndexTimeUnit,
) -> _Written:
    """Gather the group ids and order keys of every file and write the manifest (and its
    sidecars) in ``base``, under the name of ``manifest_path`` (written there directly: a
    ``shardfeed.json`` already in ``base`` is left as it is)."""
    from shardfeed.tools.pack.output import sample_schema, write_manifest

    shards = [r.info for r in results]
    group_ids = order_keys = None
    group_names = None
    if group_key is not None:
        values = [v for r in results for v in (r.groups or [])]
        group_ids, group_names = _group_ids(values, group_key)
    order_unit = None
    if order_key is not None:
        times: list[Any] = [v for r in results for v in (r.orders or [])]
        order_keys, order_unit = _order_seconds(times, order_key, time_unit)
    path = write_manifest(
        base, shards, mode="tfrecord", root=None, label_key=None, vocabularies={},
        group_key=group_key, order_key=order_key, group_ids=group_ids, order_keys=order_keys,
        group_names=group_names, schema=sample_schema(base, shards),
        extra={"order_key_unit": order_unit} if order_unit is not None else None,
        name=posixpath.basename(manifest_path.replace(os.sep, "/")),
    )
    return _Written(path=path, shards=shards, order_unit=order_unit)


def _order_seconds(
    values: list[Any], key: str, time_unit: IndexTimeUnit
) -> tuple[np.ndarray, str]:
    """The order keys as float64 seconds, and the unit they were read in."""
    if any(isinstance(v, str) for v in values):
        raise SchemaError(
            f"order key {key!r} holds non-numbers; an order key must be a number (a time)"
        )
    exact = all(isinstance(v, int) for v in values)
    array = np.asarray(values, dtype=np.int64 if exact else np.float64)
    unit: packtime.NumericUnit
    if time_unit == "auto":
        try:
            found = packtime.detect_array_unit(array)
        except ValueError as exc:
            raise SchemaError(
                f"order key {key!r}: {exc}; pass --time-unit s, ms, us or ns (time_unit=)"
            ) from None
        unit = "s" if found is None else found
    else:
        unit = time_unit
    return packtime.array_seconds(array, unit), unit
