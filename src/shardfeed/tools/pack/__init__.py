"""``pack``: images (a folder of class sub-folders, or a CSV) into indexed TFRecord shards.

::

    input --read--> items --check (N threads)--> good items --plan--> shards
          --build payloads (N threads, in order)--> ShardWriter: shard.tmp -> shard + indexes
    last: skipped.csv (what was not packed), shardfeed.json (+ groups.npy, order.npy)

Safety: every input file is checked (:mod:`shardfeed.tools.pack.check`) before anything is
written or deleted, and all bad files are reported together; ``skip_bad`` packs the rest and
lists what it skipped. Every shard is written under a temporary name and renamed only when
complete and indexed; the manifest is written last. The plan (with a digest of the inputs
and options, one per shard, and the files it writes) is saved first as
``.shardfeed-pack.json``, and each finished shard's size and CRC32C are added to it, so
``resume=True`` keeps the complete shards that still match it (read back and checked
against those checksums) and writes the rest: the result is byte-identical to an
uninterrupted run. ``resume`` on a finished pack checks it and changes nothing.
``overwrite=True`` removes what an earlier pack wrote (its manifest or plan says which) and
nothing else; no pack writes over a file it did not write.

Determinism: output bytes depend on the inputs and options only, never on ``workers``.
Memory: about ``4 × workers`` records in flight.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from shardfeed.errors import DecodeError, PackError
from shardfeed.storage import is_remote
from shardfeed.tools.pack import output as packoutput
from shardfeed.tools.pack import time as packtime
from shardfeed.tools.pack.check import BadInput, BadInputsError, CheckLevel, check_inputs
from shardfeed.tools.pack.commit import commit, commit_names, complete_result
from shardfeed.tools.pack.csvinput import CsvColumns
from shardfeed.tools.pack.errors import output_errors
from shardfeed.tools.pack.inputs import check_referenced_names, read_input, warn_far_root
from shardfeed.tools.pack.items import PackInput, PackItem
from shardfeed.tools.pack.kept import already_complete
from shardfeed.tools.pack.ledger import planned_files, record_done
from shardfeed.tools.pack.output import PackResult
from shardfeed.tools.pack.plan import PackPlan, ShardPlan, parse_size, plan_shards, sort_key
from shardfeed.tools.pack.record import MODES, Mode, build_payload, estimate_size, fingerprint
from shardfeed.tools.pack.rows import RowFields, is_data, paths_of
from shardfeed.tools.pack.workers import ExecutorKind, ordered_map
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS, check_max_pixels

__all__ = ["DEFAULT_SHARD_SIZE", "PackOptions", "PackResult", "RowFields", "ordered_map", "pack"]

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = "64MB"


@dataclass(kw_only=True, frozen=True, slots=True)
class PackOptions:
    """How to pack. ``shard_bytes`` or ``records_per_shard`` (exactly one) sizes shards;
    ``workers`` threads (or processes, ``executor="process"``) read and encode records;
    ``max_pixels``: the most pixels an input image may claim."""

    mode: Mode = "embedded"
    shard_bytes: int | None = None
    records_per_shard: int | None = None
    workers: int = 1
    executor: ExecutorKind = "thread"
    prefix: str = "shard"
    max_pixels: int = DEFAULT_MAX_PIXELS

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
        check_max_pixels(self.max_pixels)


def pack(
    source: Any,
    output: str | os.PathLike[str], *, mode: Mode = "embedded", csv: CsvColumns | None = None,
    root: str | os.PathLike[str] | None = None, shard_size: int | str | None = None,
    records_per_shard: int | None = None, workers: int = 1, executor: ExecutorKind = "thread",
    prefix: str = "shard", resume: bool = False, overwrite: bool = False,
    from_tfrecord: bool = False, progress: bool = False,
    on_shard: Callable[[str], object] | None = None, classes: Sequence[str] | None = None,
    classes_from: str | os.PathLike[str] | None = None, check: CheckLevel = "header",
    skip_bad: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS,
    fields: RowFields | None = None, append: bool = False,
) -> PackResult:
    """Pack images into indexed shards in ``output``; see the module docstring.

    ``source`` may also be data: NumPy arrays ``(images, labels)``, an iterable of dicts,
    an Arrow table, Parquet or WebDataset ``.tar`` files, or a Hugging Face dataset
    (:mod:`shardfeed.tools.pack.rows`); ``fields`` names their image, label and name
    columns and how pixel arrays are stored. Such a pack writes through the partition
    writer (one partition) and needs an empty output folder (``overwrite``: replace what an
    earlier pack wrote); ``resume`` does not apply (an iterator cannot be read again).

    ``source``: a folder of class sub-folders (label = index of the sorted class name, or of
    the name in ``classes``), a CSV file (columns named by ``csv``, paths relative to
    ``root``, default the CSV's folder), or with ``from_tfrecord`` TFRecord files (plain,
    GZIP or ZLIB) to re-pack as they are.
    ``classes``: the class list of a folder input (e.g. the training split's), so a split
    with a class missing keeps the same labels; ``classes_from``: read it from a packed
    dataset (its manifest) or a folder of class sub-folders; for a CSV input, a packed
    dataset whose one-hot vocabularies the ``csv.onehot`` columns keep.
    ``mode``: ``embedded`` (file bytes as they are), ``referenced`` (relative paths; the root
    goes into the manifest) or ``raw`` (decoded uint8 pixels). ``shard_size``: a target
    size like ``'64MB'`` (default), or ``records_per_shard``. A non-empty ``output`` needs
    ``resume`` (finish an interrupted pack; on a finished one, check it and return with
    ``PackResult.already_complete``) or ``overwrite`` (replace what an earlier pack wrote).
    A full disk or an output folder that cannot be written raises one PackError saying so.
    ``check``: ``"header"`` (default: headers and end markers of every file) or ``"decode"``
    (also decode every image); bad files raise :class:`BadInputsError` listing all of them
    before anything is written, unless ``skip_bad`` (pack the rest; ``skipped.csv`` in the
    output lists what was skipped, and so does ``PackResult.skipped``). ``max_pixels``: an
    image (or mask) whose header claims more pixels is a bad input, as a loader with that
    limit would refuse it (default 2^27; raise it for larger images, and the loader's too).

    ``append``: add the input to the dataset in ``output`` as its next version: only new
    shards are written (in ``output/vN/``), the earlier versions stay readable
    (``Dataset(output, version=k)``), a folder of classes keeps the dataset's class ids (a
    new class gets the next), records that do not match the dataset are refused with the
    difference named, and ``resume`` finishes an append that was stopped
    (:mod:`shardfeed.tools.pack.append`).

    ``output`` may be an object-storage URL (``s3://bucket/ds``): shards are built in a local
    temporary folder and uploaded as each completes, the manifest last (see
    :mod:`shardfeed.tools.pack.remote`). ``on_shard(path)`` is called after each shard written
    by this run is complete and indexed.
    """
    return _run(_PackCall(
        source=source, output=output, mode=mode, csv=csv, root=root, shard_size=shard_size,
        records_per_shard=records_per_shard, workers=workers, executor=executor, prefix=prefix,
        resume=resume, overwrite=overwrite, from_tfrecord=from_tfrecord, progress=progress,
        on_shard=on_shard, classes=classes, classes_from=classes_from, check=check,
        skip_bad=skip_bad, max_pixels=max_pixels, fields=fields, append=append,
    ))


@dataclass(kw_only=True, frozen=True, slots=True)
class _PackCall:
    """The arguments of one :func:`pack` call, as given, carried between its phases."""

    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
    output: str | os.PathLike[str]
    mode: Mode
    csv: CsvColumns | None
    root: str | os.PathLike[str] | None
    shard_size: int | str | None
    records_per_shard: int | None
    workers: int
    executor: ExecutorKind
    prefix: str
    resume: bool
    overwrite: bool
    from_tfrecord: bool
    progress: bool
    on_shard: Callable[[str], object] | None
    classes: Sequence[str] | None
    classes_from: str | os.PathLike[str] | None
    check: CheckLevel
    skip_bad: bool
    max_pixels: int
    fields: RowFields | None = None
    append: bool = False


def _run(call: _PackCall) -> PackResult:
    """Check the arguments, then pack to a URL, re-pack TFRecords, or pack images."""
    if call.classes is not None and call.classes_from is not None:
        raise ValueError("give classes or classes_from, not both")
    if call.append:
        return _append(call)
    if call.check not in ("header", "decode"):
        raise ValueError(f"check must be 'header' or 'decode', got {call.check!r}")
    output = os.fspath(call.output)
    if _is_rows(call):  # local or remote: parts are uploaded as they are written
        from shardfeed.tools.pack.rows_pack import pack_rows

        return pack_rows(call.source, output if is_remote(output) else os.path.abspath(output),
                         fields=call.fields, options=_options(call), overwrite=call.overwrite,
                         resume=call.resume, progress=call.progress, root=call.root)
    if is_remote(output):
        return _pack_to_url(call)
    options = _options(call)
    if call.resume and call.overwrite:
        raise ValueError("resume and overwrite exclude each other; choose one")
    out = os.path.abspath(os.fspath(call.output))
    if call.from_tfrecord:
        return _repack_tfrecords(call, out, options)
    source = call.source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError("source must be one folder or CSV path (lists only with from_tfrecord)")
    root, classes_from = call.root, call.classes_from
    data = read_input(
        os.fspath(source), csv=call.csv, root=os.fspath(root) if root is not None else None,
        classes=call.classes, classes_from=os.fspath(classes_from) if classes_from else None,
    )
    return _pack_images(call, out, data, options)


def _append(call: _PackCall) -> PackResult:
    """The input packed as the next version of the dataset in ``call.output``."""
    from shardfeed.tools.pack.append import append

    if call.overwrite:
        raise ValueError("append and overwrite exclude each other: append adds a version and "
                         "keeps every record there; overwrite replaces them")
    output = os.fspath(call.output)
    if not is_remote(output):
        output = os.path.abspath(output)

    def pack_into(folder: str, classes: Sequence[str] | None) -> PackResult:
        # object storage: a stopped append's folder is never read; a new one is written
        given = replace(call, output=folder, append=False,
                        resume=call.resume and not is_remote(folder))
        if classes is not None and call.classes is None:
            given = replace(given, classes=classes, classes_from=None)
        return _run(given)

    return append(output, pack_into, source=call.source, resume=call.resume)


def _is_rows(call: _PackCall) -> bool:
    """Whether ``call.source`` is data (arrays, rows, tables, tar or Parquet files)."""
    if call.fields is not None:
        return True
    paths = paths_of(call.source)
    if paths is not None:
        return is_data(paths)
    return not call.from_tfrecord


def _pack_to_url(call: _PackCall) -> PackResult:
    """Pack into a local staging folder, each shard uploaded as it completes."""
    from shardfeed.tools.pack.remote import pack_to_url

    def run(staging: str, uploaded: Callable[[str], None]) -> PackResult:
        def both(path: str) -> None:
            uploaded(path)
            if call.on_shard is not None:
                call.on_shard(path)

        return _run(replace(call, output=staging, on_shard=both, resume=False,
                            overwrite=False))

    return pack_to_url(run, os.fspath(call.output), resume=call.resume, overwrite=call.overwrite)


def _options(call: _PackCall) -> PackOptions:
    """The checked options; the default shard size when neither size was given."""
    shard_size = call.shard_size
    if call.records_per_shard is None and shard_size is None:
        shard_size = DEFAULT_SHARD_SIZE
    return PackOptions(
        mode=call.mode,
        shard_bytes=parse_size(shard_size) if shard_size is not None else None,
        records_per_shard=call.records_per_shard,
        workers=call.workers,
        executor=call.executor,
        prefix=call.prefix,
        max_pixels=call.max_pixels,
    )


def _repack_tfrecords(call: _PackCall, out: str, options: PackOptions) -> PackResult:
    """Re-pack TFRecord files as they are (``from_tfrecord``)."""
    from shardfeed.tools.pack.tfrecord import pack_tfrecords

    if call.classes is not None or call.classes_from is not None:
        raise ValueError("classes apply to a folder of images, not to --from-tfrecord")
    source = call.source
    inputs = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    return pack_tfrecords(
        [os.fspath(s) for s in inputs], out, options=options, resume=call.resume,
        overwrite=call.overwrite, progress=call.progress, on_shard=call.on_shard,
    )


def _pack_images(call: _PackCall, out: str, data: PackInput, options: PackOptions) -> PackResult:
    """Check the inputs and the output folder, plan, write the shards not kept, commit."""
    if options.mode == "referenced":
        check_referenced_names(data)
        warn_far_root(data.root, out)
    packoutput.check_output(out, resume=call.resume, overwrite=call.overwrite)
    items, bad = _checked_items(data, options, check=call.check, skip_bad=call.skip_bad,
                                progress=call.progress)
    plan = _plan(data, items, options)
    planned = planned_files(plan, commit_names(data, bad))
    with output_errors(out):
        if call.resume and packoutput.is_complete(out):
            manifest = already_complete(out, plan, mode=options.mode, progress=call.progress)
            return complete_result(out, manifest, data, bad)
        saved = packoutput.prepare(out, plan, planned=planned, resume=call.resume,
                                   overwrite=call.overwrite)
        kept = packoutput.reconcile(out, plan, saved, progress=call.progress)
        packoutput.save_plan(out, plan, planned=planned, kept=kept)
        infos = _write(out, items, plan, kept, data, options, progress=call.progress,
                       on_shard=call.on_shard)
        return commit(out, items, plan, infos, data, mode=options.mode, bad=bad,
                      kept=len(kept), planned=planned)


def _checked_items(
    data: PackInput, options: PackOptions, *, check: CheckLevel, skip_bad: bool, progress: bool
) -> tuple[list[PackItem], list[BadInput]]:
    """Check every input file (in parallel, with a progress bar); return the items to pack
    and the problems of those left out. Raises BadInputsError unless ``skip_bad``."""
    from tqdm import tqdm

    csv_lines = data.kind == "csv"
    with tqdm(total=len(data.items), unit="file", desc="check", disable=not progress) as bar:
        per_item = check_inputs(
            data.items, level=check, csv_lines=csv_lines,
            run=partial(ordered_map, workers=options.workers, executor=options.executor),
            advance=bar.update, max_pixels=options.max_pixels,
        )
    bad = [p for problems in per_item for p in problems]
    if bad and not skip_bad:
        hint = ""
        if csv_lines and any(p.problem == "does not exist" for p in bad):
            hint = f" (relative paths are resolved against '{data.root}': fix the CSV or --root)"
        raise BadInputsError(bad, where=data.where, hint=hint)
    items = [it for it, problems in zip(data.items, per_item) if not problems]
    if not items:
        raise PackError(
            f"every input file of '{data.where}' is bad ({len(bad)} problems); there is "
            "nothing to pack"
        )
    if bad:
        log.info("skipping %s of '%s'", packoutput.count(len(per_item) - len(items),
                                                           "bad input file"), data.where)
    return items, bad


def _plan(data: PackInput, items: Sequence[PackItem], options: PackOptions) -> PackPlan:
    estimate = partial(estimate_size, mode=options.mode)
    sizes = list(ordered_map(estimate, items, workers=options.workers))
    keys = [sort_key(it.group, it.order_ns, it.row) for it in items]
    described = {
        "mode": options.mode,
        "group_key": data.group_key,
        "order_key": data.order_key,
        "order_unit": packtime.STORED_UNIT if data.order_key is not None else None,
        "shard_bytes": options.shard_bytes,
        "records_per_shard": options.records_per_shard,
        "prefix": options.prefix,
    }
    return plan_shards(
        keys, sizes, records_per_shard=options.records_per_shard,
        shard_bytes=options.shard_bytes, prefix=options.prefix, fingerprint=described,
        item_lines=[fingerprint(it) for it in items],
    )


def _write(
    out: str, items: Sequence[PackItem], plan: PackPlan, kept: dict[int, Any], data: PackInput,
    options: PackOptions, *, progress: bool, on_shard: Callable[[str], object] | None,
) -> dict[int, Any]:
    """Write the shards of ``plan`` not in ``kept``; return every shard's ShardInfo."""
    from tqdm import tqdm

    build = partial(
        build_payload, mode=options.mode, group_key=data.group_key, order_key=data.order_key,
        max_pixels=options.max_pixels,
    )
    infos: dict[int, Any] = dict(kept)
    todo = [s for s in plan.shards if s.index not in kept]
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
            try:
                infos[shard.index] = packoutput.write_shard(
                    path, _take(payloads, shard, bar.update)
                )
            except (PackError, DecodeError) as exc:
                done = len(infos)
                raise PackError(
                    f"{exc}. The {done} complete shard{'' if done == 1 else 's'} written so "
                    "far are kept: fix or remove that file, then run the same command with "
                    "--resume (resume=True)"
                ) from exc
            record_done(out, infos[shard.index])
            if on_shard is not None:
                on_shard(path)
    return infos


def _take(
    payloads: Iterator[bytes], shard: ShardPlan, advance: Callable[[int], object]
) -> Iterator[bytes]:
    for _ in range(shard.records):
        try:
            payload = next(payloads)
        except StopIteration:  # pragma: no cover - the plan and the positions agree
            raise PackError(f"internal error: shard '{shard.name}' ran out of records") from None
        yield payload
        advance(1)
