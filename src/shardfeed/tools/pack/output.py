"""The output folder of ``pack``: refusing to clobber, the saved plan, resuming, the manifest.

Files ``pack`` writes in its output folder::

    .shardfeed-pack.json        the plan of a pack in progress, and each finished shard's
                                CRC32C (removed when the pack completes)
    shard-00000-of-00004.tfrecord (+ .idx, .idx.npy)    complete shards only
    shard-00001-of-00004.tfrecord.tmp (+ .idx.tmp, ...)  a shard being written
    skipped.csv                 the inputs not packed (bad files with skip_bad, non-images)
    shardfeed.json, groups.npy, order.npy               written last: the dataset is whole

A folder with a manifest and no plan file is a complete dataset; one with a plan file is an
interrupted pack that ``resume`` can finish. Only files the plan file or a pack's manifest
name are pack's (:mod:`shardfeed.tools.pack.ledger`): ``overwrite`` removes those and no
others, and no pack writes over a file that is not. ``check_output`` refuses what
``prepare`` would refuse without touching anything, so ``pack`` can check its inputs before
it deletes or writes a file; :func:`shardfeed.tools.pack.errors.output_errors` turns a full
disk or an unwritable folder into one PackError.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from shardfeed.errors import PackError
from shardfeed.format import spec
from shardfeed.format.manifest import ShardInfo
from shardfeed.format.manifest_check import Mode
from shardfeed.tools.pack.ledger import (
    COMMIT_NAMES,
    PLAN_NAME,
    SKIPPED_NAME,
    Ledger,
    manifest_files,
    owned_files,
    ownership,
    parse_ledger,
    refuse_in_the_way,
    remove_ledger,
    write_ledger,
)
from shardfeed.tools.pack.plan import PackPlan

if TYPE_CHECKING:
    from shardfeed.tools.pack.check import BadInput

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PackResult:
    """What ``pack`` wrote: the manifest path, shard count, record count, bytes, and how many
    complete shards an interrupted run had left that were kept (``resume``);
    ``already_complete``: ``resume`` found the pack finished and checked, and wrote nothing.
    An append: ``version`` made, and the records and shards it ``added`` (the other counts
    are the whole version's)."""

    output: str
    manifest: str
    shards: int
    records: int
    bytes: int
    kept_shards: int
    skipped: tuple[BadInput, ...] = ()
    skipped_list: str | None = None
    order_unit: str | None = None
    ignored: tuple[str, ...] = ()
    already_complete: bool = False
    version: int | None = None
    added: tuple[int, int] | None = None  # an append's (records, shards)

    def to_json(self) -> dict[str, Any]:
        """A plain summary (``shardfeed pack --json``)."""
        return {
            "ok": True, "output": self.output, "manifest": self.manifest, "shards": self.shards,
            "records": self.records, "bytes": self.bytes, "kept_shards": self.kept_shards,
            "skipped": [
                {"path": p.path, "line": p.line, "problem": p.problem} for p in self.skipped
            ],
            "ignored": list(self.ignored), "skipped_list": self.skipped_list,
            "order_unit": self.order_unit, "already_complete": self.already_complete,
            "version": self.version,
            "added": None if self.added is None else {"records": self.added[0],
                                                      "shards": self.added[1]},
        }


def write_shard(path: str, payloads: Iterable[bytes]) -> Any:
    """Write one complete shard through ShardWriter; returns its ShardInfo."""
    from shardfeed.format.writer import ShardWriter

    writer = ShardWriter(path)
    try:
        for payload in payloads:
            writer.write(payload)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def count(n: int, noun: str) -> str:
    """``count(1, "shard")`` is ``1 shard``, ``count(3, "shard")`` is ``3 shards``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def digest_lines(lines: Iterable[str]) -> str:
    """SHA-256 over lines (for fingerprints of many items without one giant string)."""
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()


def check_output(out: str, *, resume: bool, overwrite: bool) -> None:
    """Raise what :func:`prepare` would raise for ``out`` before planning, changing nothing."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise PackError(f"output '{out}' is a file; name a folder (it is created if missing)")
    entries = sorted(os.listdir(out)) if os.path.isdir(out) else []
    if not entries or overwrite:
        return
    if not resume:
        raise PackError(
            f"output folder '{out}' is not empty ({_entries(len(entries))}); pass --resume "
            "(resume=True) to finish an interrupted pack there, or --overwrite "
            "(overwrite=True) to replace what an earlier pack wrote there, or choose an empty "
            "folder"
        )
    if PLAN_NAME not in entries and spec.MANIFEST_NAME not in entries:
        raise PackError(
            f"output folder '{out}' holds no interrupted pack (no {PLAN_NAME}); choose an "
            "empty folder, or pass --overwrite to replace what an earlier pack wrote there"
        )


def is_complete(out: str) -> bool:
    """True when ``out`` holds a committed dataset (a manifest) and no pack in progress."""
    return os.path.isfile(os.path.join(out, spec.MANIFEST_NAME)) and not os.path.exists(
        os.path.join(out, PLAN_NAME)
    )


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def prepare(
    out: str, plan: PackPlan, *, planned: Sequence[str], resume: bool, overwrite: bool
) -> Ledger | None:
    """Make ``out`` ready for a pack of ``plan`` that writes the files ``planned``; return
    the saved ledger when resuming.

    A missing or empty folder is always fine. Files no earlier pack wrote there stay, and a
    pack that would write over one of them is refused before anything changes.
    ``overwrite`` removes exactly what earlier packs wrote (their manifest and plan file name
    it: see :mod:`shardfeed.tools.pack.ledger`); ``resume`` needs the plan file of an
    interrupted pack, and removes that pack's manifest, sidecars and temporary files (a
    resumed pack writes them again).
    """
    check_output(out, resume=resume, overwrite=overwrite)
    os.makedirs(out, exist_ok=True)
    entries = sorted(os.listdir(out))
    if not entries:
        return None
    plan_path = os.path.join(out, PLAN_NAME)
    data = _read(plan_path)
    try:
        saved = None if data is None else parse_ledger(data, where=plan_path)
    except PackError:
        if resume:
            raise
        saved = None  # overwrite: only the plan file itself is known to be pack's
    found = ownership(entries, manifest=_read(os.path.join(out, spec.MANIFEST_NAME)),
                      ledger=saved, planned=planned)
    refuse_in_the_way(out, found)
    if overwrite:
        # the new plan names the old files too until they are gone: an interrupted
        # overwrite leaves a folder whose every file pack wrote is still on record
        listed = [*manifest_files(_read(os.path.join(out, spec.MANIFEST_NAME))),
                  *(saved.files if saved is not None else ())]
        gone = owned_files(found.owned, listed)
        write_ledger(out, plan, files=[*planned, *found.owned, *gone])
        for name in sorted(gone, key=lambda n: n != spec.MANIFEST_NAME):
            path = os.path.join(out, name)
            if name != PLAN_NAME and os.path.isfile(path) and not _through_link(out, name):
                os.remove(path)
        for name in found.owned:  # an append's version folder, emptied: removed
            if os.path.isdir(os.path.join(out, name)):
                _remove_folder(out, name)
        if found.others:
            shown = ", ".join(found.others[:5]) + (", ..." if len(found.others) > 5 else "")
            log.warning(
                "output '%s' keeps %s pack did not write (%s): they stay beside the new "
                "dataset", out, count(len(found.others), "file"), shown,
            )
        return None
    if saved is None:
        raise PackError(f"cannot read the saved plan '{plan_path}'; pass --overwrite to start over")
    # what the interrupted pack wrote after its shards is written again at the end
    for name in found.owned:
        path = os.path.join(out, name)
        if (name in COMMIT_NAMES or name.endswith(spec.TEMP_SUFFIX)) and os.path.isfile(path):
            os.remove(path)
    return saved


def _through_link(out: str, name: str) -> bool:
    """Whether the file ``name`` of ``out`` lies in a version folder that is a link (never
    followed: it may lead anywhere)."""
    return "/" in name and os.path.islink(os.path.join(out, name.split("/", 1)[0]))


def _remove_folder(out: str, folder: str) -> None:
    """Remove an append's version folder once emptied (a file no pack wrote keeps it)."""
    path = os.path.join(out, folder)
    if os.path.islink(path):
        log.warning("output '%s': '%s' is a link; pack removes nothing through it", out, folder)
        return
    try:
        os.rmdir(path)
    except OSError:
        log.warning("output '%s' keeps files pack did not write in '%s'", out, folder)


def save_plan(out: str, plan: PackPlan, *, planned: Sequence[str],
              kept: Mapping[int, ShardInfo]) -> None:
    """Write the plan file of ``plan`` (the files it writes, its kept shards as done)."""
    write_ledger(out, plan, files=planned, done=[kept[i] for i in sorted(kept)])


def remove_plan(out: str) -> None:
    remove_ledger(out)


def reconcile(
    out: str, plan: PackPlan, saved: Ledger | None, *, progress: bool = False
) -> dict[int, ShardInfo]:
    """Shards of ``plan`` already complete in ``out`` (index -> ShardInfo) when resuming.

    The saved plan must have the same digest (same inputs, options and plan), or the same
    options with shard digests: then the inputs changed (a bad file fixed or removed), and
    only the shards whose own digest is unchanged are candidates. A candidate is kept when
    it is exactly what was written: see :func:`shardfeed.tools.pack.kept.check_kept`.
    Anything else of either plan on disk is deleted, to be written again.
    """
    from shardfeed.tools.pack.kept import check_kept

    if saved is None:
        return {}
    same = saved.plan.get("digest") == plan.digest
    if not same:
        old = {str(s.get("name")): str(s.get("digest", "")) for s in saved.plan["shards"]}
        if not plan.options_digest or saved.plan.get("options") != plan.options_digest or not all(
            old.values()
        ):
            raise PackError(
                f"output folder '{out}' holds an interrupted pack of other options (the plan "
                "differs); re-run with the same options, or pass --overwrite to start over"
            )
        wanted = {s.name: s.digest for s in plan.shards}
        for name, digest in old.items():
            if wanted.get(name) != digest and name.endswith(spec.SHARD_SUFFIX):
                _remove_shard(out, name)
        log.info("the inputs changed since the interrupted pack: unchanged shards are kept")
    candidates = [s for s in plan.shards if os.path.isfile(os.path.join(out, s.name))]
    kept = check_kept(out, candidates, saved.done, progress=progress)
    for shard in candidates:
        if shard.index not in kept:
            _remove_shard(out, shard.name)
    return kept


def _remove_shard(out: str, name: str) -> None:
    path = os.path.join(out, os.path.basename(name))
    for p in (path, spec.text_index_path(path), spec.binary_index_path(path)):
        if os.path.exists(p):
            os.remove(p)


def write_skipped(out: str, rows: Sequence[tuple[str, int | None, str]]) -> str | None:
    """Write ``skipped.csv`` (``path,line,problem``) into ``out`` when there are ``rows``;
    return its path or None."""
    import csv
    import io

    path = os.path.join(out, SKIPPED_NAME)
    if not rows:
        return None  # a stale list of an earlier pack went with its other files
    from shardfeed.format._fileio import write_bytes_atomic

    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["path", "line", "problem"])
    for file, line, problem in rows:
        writer.writerow([file, "" if line is None else line, problem])
    write_bytes_atomic(path, text.getvalue().encode("utf-8", "surrogateescape"))
    return path


def write_manifest(
    out: str,
    shards: Sequence[Any],
    *,
    mode: Mode,
    root: str | None,
    label_key: str | None,
    vocabularies: Mapping[str, Sequence[str]],
    group_key: str | None,
    order_key: str | None,
    group_ids: np.ndarray | None,
    order_keys: np.ndarray | None,
    group_names: Sequence[str] | None = None,
    schema: Any = None,
    extra: Mapping[str, Any] | None = None,
    name: str = spec.MANIFEST_NAME,
) -> str:
    """Write the group/order sidecars, then the manifest ``name`` (``shardfeed.json`` unless
    asked otherwise; atomically, last) into ``out``; return the manifest path. ``mode`` is
    pack's (``raw`` is stored as ``embedded``: the pixels are inside the records). The
    schema is inferred from the first records unless given; class names, one-hot
    vocabularies and ``extra`` go into the manifest's ``extra``."""
    import dataclasses

    from shardfeed.format.manifest import Manifest, save_sidecars
    from shardfeed.format.schema import ImageInfo
    from shardfeed.tools.pack.record import MASK_PATH

    if schema is None:
        schema = sample_schema(out, shards)
        if label_key is not None and label_key in schema.features:
            schema = dataclasses.replace(schema, label_key=label_key)
        if schema.mask is None and MASK_PATH in schema.features:
            schema = dataclasses.replace(schema, mask=ImageInfo(MASK_PATH, "path"))
    more: dict[str, Any] = dict(extra or {})
    if vocabularies:
        more["vocabularies"] = {k: list(v) for k, v in vocabularies.items()}
    if group_names is not None:
        more["group_names"] = list(group_names)
    save_sidecars(out, group_ids=group_ids, order_keys=order_keys)
    manifest = Manifest(
        shards=list(shards),
        schema=schema,
        mode=mode,
        root=root,
        group_key=group_key,
        order_key=order_key,
        extra=more,
    )
    from shardfeed.storage.files import join

    path = join(out, name)
    manifest.save(path)
    return path


def sample_schema(out: str, shards: Sequence[Any], *, sample: int = 32) -> Any:
    """Infer the schema from up to ``sample`` records of the first non-empty shard."""
    from shardfeed.format.example import decode_example
    from shardfeed.format.framing import unframe
    from shardfeed.format.index import load_binary_index
    from shardfeed.format.schema import infer_schema
    from shardfeed.storage import open_source
    from shardfeed.storage.files import join

    records: list[dict[str, Any]] = []
    for info in shards:
        if info.records == 0:
            continue
        path = info.path if os.path.isabs(info.path) else join(out, info.path)
        offsets = load_binary_index(spec.binary_index_path(path), mmap=False)
        n = min(sample, int(offsets.size) - 1)
        src = open_source(path)
        try:
            for i in range(n):
                a, b = int(offsets[i]), int(offsets[i + 1])
                payload = unframe(src.read(a, b - a), path=path, record=i, offset=a)
                records.append(decode_example(payload))
        finally:
            src.close()
        break
    return infer_schema(records)
