"""The output folder of ``pack``: refusing to clobber, the saved plan, resuming, the manifest.

Files ``pack`` owns in its output folder::

    .shardfeed-pack.json        the plan of a pack in progress (removed when it completes)
    shard-00000-of-00004.tfrecord (+ .idx, .idx.npy)    complete shards only
    shard-00001-of-00004.tfrecord.tmp                   a shard being written
    skipped.csv                 the inputs not packed (bad files with skip_bad, non-images)
    shardfeed.json, groups.npy, order.npy               written last: the dataset is whole

A folder with a manifest and no plan file is a complete dataset; one with a plan file is an
interrupted pack that ``resume`` can finish. ``check_output`` refuses what ``prepare`` would
refuse without touching anything, so ``pack`` can check its inputs before it deletes or
writes a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from shardfeed.errors import PackError, ShardfeedError
from shardfeed.format import spec
from shardfeed.format.manifest import Mode
from shardfeed.tools.packplan import PackPlan

if TYPE_CHECKING:
    from shardfeed.tools.packcheck import BadInput

log = logging.getLogger(__name__)

PLAN_NAME = spec.PACK_PLAN_NAME
SKIPPED_NAME = "skipped.csv"


@dataclass(frozen=True, slots=True)
class PackResult:
    """What ``pack`` wrote: the manifest path, shard count, record count, bytes, and how many
    complete shards an interrupted run had left that were kept (``resume``)."""

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

    def to_json(self) -> dict[str, Any]:
        """A plain summary (``shardfeed pack --json``)."""
        return {
            "ok": True, "output": self.output, "manifest": self.manifest, "shards": self.shards,
            "records": self.records, "bytes": self.bytes, "kept_shards": self.kept_shards,
            "skipped": [
                {"path": p.path, "line": p.line, "problem": p.problem} for p in self.skipped
            ],
            "ignored": list(self.ignored), "skipped_list": self.skipped_list,
            "order_unit": self.order_unit,
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


def _owned(name: str) -> bool:
    """True for the files pack writes (and may delete with ``overwrite``)."""
    return (
        name in (PLAN_NAME, SKIPPED_NAME, spec.MANIFEST_NAME, spec.GROUPS_NAME,
                 spec.ORDER_NAME)
        or name.endswith((spec.SHARD_SUFFIX, spec.TEXT_INDEX_SUFFIX, spec.BINARY_INDEX_SUFFIX,
                          spec.TEMP_SUFFIX))
    )


def check_output(out: str, *, resume: bool, overwrite: bool) -> None:
    """Raise what :func:`prepare` would raise for ``out``, changing nothing."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise PackError(f"output '{out}' is a file; name a folder (it is created if missing)")
    entries = sorted(os.listdir(out)) if os.path.isdir(out) else []
    if not entries or overwrite:
        return
    if not resume:
        raise PackError(
            f"output folder '{out}' is not empty ({_entries(len(entries))}); pass --resume "
            "(resume=True) to finish an interrupted pack there, or --overwrite "
            "(overwrite=True) to replace it, or choose an empty folder"
        )
    if not os.path.isfile(os.path.join(out, PLAN_NAME)):
        if spec.MANIFEST_NAME in entries:
            raise PackError(
                f"output folder '{out}' holds a complete dataset, there is nothing to resume; "
                "pass --overwrite to pack it again"
            )
        raise PackError(
            f"output folder '{out}' holds no interrupted pack (no {PLAN_NAME}); choose an "
            "empty folder, or pass --overwrite to replace its contents"
        )


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def prepare(out: str, *, resume: bool, overwrite: bool) -> dict[str, Any] | None:
    """Make ``out`` ready to write into; return the saved plan when resuming.

    An empty or missing folder is always fine. Otherwise ``overwrite`` deletes the files pack
    writes (others are left, with a warning), and ``resume`` needs the saved plan of an
    interrupted pack. Without either, a non-empty folder is refused.
    """
    check_output(out, resume=resume, overwrite=overwrite)
    os.makedirs(out, exist_ok=True)
    entries = sorted(os.listdir(out))
    if not entries:
        return None
    if overwrite:
        others = [e for e in entries if not _owned(e)]
        for name in entries:
            if _owned(name) and os.path.isfile(os.path.join(out, name)):
                os.remove(os.path.join(out, name))
        if others:
            log.warning(
                "output '%s' keeps %s pack did not write (%s)", out,
                count(len(others), "file"), ", ".join(others[:3]),
            )
        return None
    plan_path = os.path.join(out, PLAN_NAME)
    try:
        with open(plan_path, encoding="utf-8") as f:
            saved: dict[str, Any] = json.load(f)
    except (OSError, ValueError) as exc:
        raise PackError(
            f"cannot read the saved plan '{plan_path}' ({exc}); pass --overwrite to start over"
        ) from None
    # a manifest left by an older complete run is stale once a new pack has started here
    for name in (spec.MANIFEST_NAME, spec.GROUPS_NAME, spec.ORDER_NAME):
        if name in entries:
            os.remove(os.path.join(out, name))
    for name in entries:
        if name.endswith(spec.TEMP_SUFFIX):
            os.remove(os.path.join(out, name))
    return saved


def save_plan(out: str, plan: PackPlan) -> None:
    from shardfeed.format._fileio import write_bytes_atomic

    text = json.dumps(plan.to_json(), indent=1).encode("utf-8")
    write_bytes_atomic(os.path.join(out, PLAN_NAME), text)


def remove_plan(out: str) -> None:
    try:
        os.remove(os.path.join(out, PLAN_NAME))
    except FileNotFoundError:
        pass


def shard_info(path: str, name: str) -> Any:
    """The ShardInfo of a complete shard on disk (records from its index, whole-file CRC)."""
    import google_crc32c

    from shardfeed.format.index import load_binary_index
    from shardfeed.format.manifest import ShardInfo

    offsets = load_binary_index(spec.binary_index_path(path), mmap=False)
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            crc = int(google_crc32c.extend(crc, chunk))
    return ShardInfo(path=name, records=int(offsets.size - 1), bytes=int(offsets[-1]), crc32c=crc)


def reconcile(out: str, plan: PackPlan, saved: Mapping[str, Any] | None) -> dict[int, Any]:
    """Shards of ``plan`` already complete in ``out`` (index -> ShardInfo) when resuming.

    The saved plan must have the same digest (same inputs, options and plan), or the same
    options with shard digests: then the inputs changed (a bad file fixed or removed), and
    only the shards whose own digest is unchanged are candidates. A candidate is kept when
    its indexes exist and agree with the plan's record count and the file size. Anything
    else of either plan on disk is deleted, to be written again.
    """
    if saved is None:
        return {}
    same = saved.get("digest") == plan.digest
    wanted = {s.name: s.digest for s in plan.shards}
    if not same:
        old = {str(s.get("name")): str(s.get("digest", "")) for s in saved.get("shards", [])}
        if not plan.options_digest or saved.get("options") != plan.options_digest or not all(
            old.values()
        ):
            raise PackError(
                f"output folder '{out}' holds an interrupted pack of other options (the plan "
                "differs); re-run with the same options, or pass --overwrite to start over"
            )
        for name, digest in old.items():
            if wanted.get(name) != digest and name.endswith(spec.SHARD_SUFFIX):
                _remove_shard(out, name)
        log.info("the inputs changed since the interrupted pack: unchanged shards are kept")
    kept: dict[int, Any] = {}
    for shard in plan.shards:
        path = os.path.join(out, shard.name)
        if not os.path.isfile(path):
            continue
        try:
            info = shard_info(path, shard.name)
            ok = info.records == shard.records and info.bytes == os.path.getsize(path)
        except (ShardfeedError, OSError, ValueError):
            ok = False
        if ok:
            kept[shard.index] = info
            continue
        log.warning("shard '%s' does not match the plan; writing it again", path)
        _remove_shard(out, shard.name)
    return kept


def _remove_shard(out: str, name: str) -> None:
    path = os.path.join(out, os.path.basename(name))
    for p in (path, spec.text_index_path(path), spec.binary_index_path(path)):
        if os.path.exists(p):
            os.remove(p)


def write_skipped(out: str, rows: Sequence[tuple[str, int | None, str]]) -> str | None:
    """Write ``skipped.csv`` (``path,line,problem``) into ``out``, or remove a stale one when
    ``rows`` is empty; return its path or None."""
    import csv
    import io

    path = os.path.join(out, SKIPPED_NAME)
    if not rows:
        if os.path.isfile(path):
            os.remove(path)
        return None
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
) -> str:
    """Write the group/order sidecars, then ``shardfeed.json`` (atomically, last); return
    the manifest path. ``mode`` is pack's (``raw`` is stored as ``embedded``: the pixels are
    inside the records). The schema is inferred from the first records unless given; class
    names, one-hot vocabularies and ``extra`` go into the manifest's ``extra``."""
    import dataclasses

    from shardfeed.format.manifest import Manifest, save_sidecars
    from shardfeed.format.schema import ImageInfo
    from shardfeed.tools.packrecord import MASK_PATH

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
    path = os.path.join(out, spec.MANIFEST_NAME)
    manifest.save(path)
    return path


def sample_schema(out: str, shards: Sequence[Any], *, sample: int = 32) -> Any:
    """Infer the schema from up to ``sample`` records of the first non-empty shard."""
    from shardfeed.format.example import decode_example
    from shardfeed.format.framing import unframe
    from shardfeed.format.index import load_binary_index
    from shardfeed.format.schema import infer_schema
    from shardfeed.storage import open_source

    records: list[dict[str, Any]] = []
    for info in shards:
        if info.records == 0:
            continue
        path = info.path if os.path.isabs(info.path) else os.path.join(out, info.path)
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
