"""``pack``: images (a folder of class sub-folders, or a CSV) into indexed TFRecord shards.

::

    input --read--> items --plan--> shards --build payloads (N threads, in order)--> ShardWriter
                                                             shard.tmp -> shard + .idx + .idx.npy
    last: shardfeed.json (+ groups.npy, order.npy), written atomically

Safety: every shard is written under a temporary name and renamed only when complete and
indexed; the manifest is written last. The plan (with a digest of the inputs and options) is
saved first as ``.shardfeed-pack.json``, so ``resume=True`` keeps the complete shards that
match it and writes the rest: the result is byte-identical to an uninterrupted run.

Determinism: output bytes depend on the inputs and options only, never on ``workers``.
Memory: about ``4 × workers`` records in flight.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np

from shardfeed.errors import PackError
from shardfeed.storage import is_remote
from shardfeed.tools import packoutput
from shardfeed.tools.csvinput import CsvColumns, read_csv
from shardfeed.tools.packitems import PackInput, scan_folder
from shardfeed.tools.packoutput import PackResult
from shardfeed.tools.packplan import ShardPlan, parse_size, plan_shards, sort_key
from shardfeed.tools.packrecord import MODES, Mode, build_payload, estimate_size, fingerprint

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_SHARD_SIZE = "64MB"


@dataclass(frozen=True, slots=True)
class PackOptions:
    """How to pack. ``shard_bytes`` or ``records_per_shard`` (exactly one) sizes shards;
    ``workers`` threads (or processes, ``executor="process"``) read and encode records."""

    mode: Mode = "embedded"
    shard_bytes: int | None = None
    records_per_shard: int | None = None
    workers: int = 1
    executor: str = "thread"
    prefix: str = "shard"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if (self.shard_bytes is None) == (self.records_per_shard is None):
            raise ValueError(
                "give exactly one of shard_size (e.g. '64MB') or records_per_shard"
            )
        if self.records_per_shard is not None and self.records_per_shard < 1:
            raise ValueError(f"records_per_shard must be >= 1, got {self.records_per_shard}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.executor not in ("thread", "process"):
            raise ValueError(f"executor must be 'thread' or 'process', got {self.executor!r}")
        if not self.prefix or "/" in self.prefix or os.sep in self.prefix:
            raise ValueError(f"prefix must be a plain file name part, got {self.prefix!r}")


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], *, workers: int, executor: str = "thread"
) -> Iterator[R]:
    """``map(fn, items)`` computed by ``workers`` threads or processes, yielded in order.

    At most ``4 × workers`` results are in flight. On error the pending work is cancelled
    and the first exception (in item order) propagates.

    Processes start with "forkserver" (or "spawn" where there is none), never a plain fork:
    forking a process that runs threads (JAX, torch, a progress bar) can deadlock the child.
    ``fn`` and the items must therefore pickle, and a script that packs with processes needs
    the usual ``if __name__ == "__main__":`` guard.
    """
    if workers == 1:
        yield from map(fn, items)
        return
    pool: Executor = (
        ThreadPoolExecutor(max_workers=workers) if executor == "thread"
        else ProcessPoolExecutor(max_workers=workers, mp_context=_process_context())
    )
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 4 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _process_context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _read_input(
    source: str, *, csv: CsvColumns | None, root: str | None
) -> PackInput:
    if os.path.isdir(source):
        if csv is not None:
            raise ValueError(
                f"CSV columns were given but '{source}' is a folder; pass the CSV file instead"
            )
        return scan_folder(source)
    if not os.path.exists(source):
        raise PackError(f"input '{source}' does not exist; name a folder of images or a CSV")
    return read_csv(source, columns=csv or CsvColumns(), root=root)


def pack(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    mode: Mode = "embedded",
    csv: CsvColumns | None = None,
    root: str | os.PathLike[str] | None = None,
    shard_size: int | str | None = None,
    records_per_shard: int | None = None,
    workers: int = 1,
    executor: str = "thread",
    prefix: str = "shard",
    resume: bool = False,
    overwrite: bool = False,
    from_tfrecord: bool = False,
    progress: bool = False,
    on_shard: Callable[[str], object] | None = None,
) -> PackResult:
    """Pack images into indexed shards in ``output``; see the module docstring.

    ``source``: a folder of class sub-folders (label = index of the sorted class name), a CSV
    file (columns named by ``csv``, paths relative to ``root``, default the CSV's folder), or
    with ``from_tfrecord`` TFRecord files (plain, GZIP or ZLIB) to re-pack as they are.
    ``mode``: ``embedded`` (file bytes as they are), ``referenced`` (relative paths; the root
    goes into the manifest) or ``raw`` (decoded uint8 pixels). ``shard_size``: a target
    size like ``'64MB'`` (default), or ``records_per_shard``. A non-empty ``output`` needs
    ``resume`` (finish an interrupted pack) or ``overwrite``.

    ``output`` may be an object-storage URL (``s3://bucket/ds``): shards are built in a local
    temporary folder and uploaded as each completes, the manifest last (see
    :mod:`shardfeed.tools.packremote`). ``on_shard(path)`` is called after each shard written
    by this run is complete and indexed.
    """
    if is_remote(os.fspath(output)):
        from shardfeed.tools.packremote import pack_to_url

        def run(staging: str, uploaded: Callable[[str], None]) -> PackResult:
            def both(path: str) -> None:
                uploaded(path)
                if on_shard is not None:
                    on_shard(path)

            return pack(source, staging, mode=mode, csv=csv, root=root, shard_size=shard_size,
                        records_per_shard=records_per_shard, workers=workers,
                        executor=executor, prefix=prefix, from_tfrecord=from_tfrecord,
                        progress=progress, on_shard=both)

        return pack_to_url(run, os.fspath(output), resume=resume, overwrite=overwrite)
    if records_per_shard is None and shard_size is None:
        shard_size = DEFAULT_SHARD_SIZE
    options = PackOptions(
        mode=mode,
        shard_bytes=parse_size(shard_size) if shard_size is not None else None,
        records_per_shard=records_per_shard,
        workers=workers,
        executor=executor,
        prefix=prefix,
    )
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other; choose one")
    out = os.path.abspath(os.fspath(output))
    if from_tfrecord:
        from shardfeed.tools.packtfrecord import pack_tfrecords

        inputs = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        return pack_tfrecords(
            [os.fspath(s) for s in inputs], out, options=options, resume=resume,
            overwrite=overwrite, progress=progress, on_shard=on_shard,
        )
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError("source must be one folder or CSV path (lists only with from_tfrecord)")
    data = _read_input(
        os.fspath(source), csv=csv, root=os.fspath(root) if root is not None else None
    )
    saved = packoutput.prepare(out, resume=resume, overwrite=overwrite)
    items = data.items
    estimate = partial(estimate_size, mode=options.mode)
    sizes = list(ordered_map(estimate, items, workers=options.workers))
    keys = [sort_key(it.group, it.order, it.row) for it in items]
    order_int = data.order_key is not None and all(
        it.order is not None and float(it.order).is_integer() for it in items
    )
    described = {
        "mode": options.mode,
        "group_key": data.group_key,
        "order_key": data.order_key,
        "order_int": order_int,
        "items": packoutput.digest_lines(fingerprint(it) for it in items),
    }
    plan = plan_shards(
        keys, sizes, records_per_shard=options.records_per_shard,
        shard_bytes=options.shard_bytes, prefix=options.prefix, fingerprint=described,
    )
    kept = packoutput.reconcile(out, plan, saved)
    packoutput.save_plan(out, plan)
    build = partial(
        build_payload, mode=options.mode, group_key=data.group_key, order_key=data.order_key,
        order_int=order_int,
    )
    infos: dict[int, Any] = dict(kept)
    todo = [s for s in plan.shards if s.index not in kept]
    from tqdm import tqdm

    with tqdm(
        total=len(items), initial=sum(plan.shards[i].records for i in kept), unit="img",
        desc="pack", disable=not progress,
    ) as bar:
        positions = (pos for shard in todo for pos in range(shard.start, shard.stop))
        payloads = ordered_map(
            build, (items[plan.order[p]] for p in positions),
            workers=options.workers, executor=options.executor,
        )
        for shard in todo:
            path = os.path.join(out, shard.name)
            infos[shard.index] = packoutput.write_shard(path, _take(payloads, shard, bar.update))
            if on_shard is not None:
                on_shard(path)
    group_ids = order_keys = None
    if data.group_key is not None:
        group_ids = np.array([items[i].group for i in plan.order], dtype=np.int64)
    if data.order_key is not None:
        order_keys = np.array([items[i].order for i in plan.order], dtype=np.float64)
    manifest = packoutput.write_manifest(
        out,
        [infos[s.index] for s in plan.shards],
        mode=options.mode,
        root=data.root if options.mode == "referenced" else None,
        label_key=data.label_key,
        vocabularies=dict(data.vocabularies),
        group_key=data.group_key,
        order_key=data.order_key,
        group_ids=group_ids,
        order_keys=order_keys,
        group_names=data.group_names,
    )
    packoutput.remove_plan(out)
    total_bytes = sum(int(infos[s.index].bytes) for s in plan.shards)
    log.info("packed %d records into %d shards in '%s'", len(items), len(plan.shards), out)
    return PackResult(
        output=out, manifest=manifest, shards=len(plan.shards), records=len(items),
        bytes=total_bytes, kept_shards=len(kept),
    )


def _take(payloads: Iterator[bytes], shard: ShardPlan, advance: Callable[[int], object]) -> Iterator[bytes]:
    for _ in range(shard.records):
        try:
            payload = next(payloads)
        except StopIteration:  # pragma: no cover - the plan and the positions agree
            raise PackError(f"internal error: shard '{shard.name}' ran out of records") from None
        yield payload
        advance(1)
