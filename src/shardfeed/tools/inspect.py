"""``inspect``: what a dataset holds: shards, records, bytes, schema, groups, first records.

Works on anything ``Dataset`` opens, local or on object storage, resolved by the same code
(and refused the same way when a pack did not finish): a packed or indexed dataset
(everything comes from the manifest and sidecars, no record is read unless ``records > 0``)
and bare TFRecord files (their offsets from their indexes, or a scan, never written; schema
inferred from the first records).

Determinism: a pure function of the files. Memory: the group sidecars and n+1 offsets a
shard.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from shardfeed.dataset.opening import Resolved, referenced_root, resolve_sources

if TYPE_CHECKING:
    from shardfeed.format.manifest import Manifest

SCHEMA_SAMPLE = 32


def _brief(value: Any, *, limit: int = 8) -> Any:
    """A short JSON-friendly rendering of one decoded feature value."""
    if isinstance(value, bytes):
        if len(value) <= 64:
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                return f"<{len(value)} bytes>"
            if text.isprintable():
                return text
        return f"<{len(value)} bytes>"
    if isinstance(value, list):
        return f"<{len(value)} byte strings>"
    if isinstance(value, np.ndarray):
        values = value.tolist()
        if value.dtype.kind == "f":
            values = [round(float(v), 6) for v in values]
        if len(values) == 1:
            return values[0]
        if len(values) > limit:
            return values[:limit] + [f"... ({len(values)} values)"]
        return values
    return str(value)


def _schema_rows(schema: Any) -> list[dict[str, Any]]:
    if schema is None:
        return []
    roles: dict[str, str] = {}
    encodings: dict[str, str] = {}
    for role, info in (("image", schema.image), ("mask", schema.mask)):
        if info is not None:
            roles[info.key] = role
            encodings[info.key] = info.encoding
    if schema.label_key:
        roles[schema.label_key] = "label"
    return [
        {"name": name, "kind": f.kind, "length": f.length, "role": roles.get(name),
         "encoding": encodings.get(name)}
        for name, f in sorted(schema.features.items())
    ]


def _group_stats(groups: np.ndarray | None, order: np.ndarray | None) -> dict[str, Any] | None:
    if groups is None:
        return None
    ids, counts = np.unique(np.asarray(groups), return_counts=True)
    stats: dict[str, Any] = {
        "count": int(ids.size),
        "records_per_group": {
            "min": int(counts.min()) if counts.size else 0,
            "median": float(np.median(counts)) if counts.size else 0.0,
            "max": int(counts.max()) if counts.size else 0,
        },
    }
    if order is not None and order.size:
        arr = np.asarray(order, dtype=np.float64)
        grp = np.asarray(groups)
        spans = [float(arr[grp == g].max() - arr[grp == g].min()) for g in ids[:10000]]
        stats["order_span_seconds"] = {
            "min": min(spans), "median": float(np.median(spans)), "max": max(spans),
        }
        stats["order_range"] = [float(arr.min()), float(arr.max())]
    return stats


def _read_records(path: str, offsets: np.ndarray, count: int) -> list[dict[str, Any]]:
    from shardfeed.format.example import decode_example
    from shardfeed.format.framing import unframe
    from shardfeed.storage import open_source

    out: list[dict[str, Any]] = []
    src = open_source(path)
    try:
        for i in range(min(count, int(offsets.size) - 1)):
            a, b = int(offsets[i]), int(offsets[i + 1])
            payload = unframe(src.read(a, b - a), path=path, record=i, offset=a)
            out.append(decode_example(payload))
    finally:
        src.close()
    return out


def _offsets(url: str) -> np.ndarray:
    """The n+1 record offsets of a shard: from its index as ``Dataset`` finds it, else a scan
    (nothing is written: inspecting changes no file)."""
    from shardfeed.dataset.shards import find_index
    from shardfeed.format.framing import scan

    found = find_index(url, mmap=False)
    return np.asarray(found) if found is not None else scan(url)


def _window_stats(
    groups: np.ndarray | None, order: np.ndarray | None, *, length: int, stride: int,
    stride_seconds: float | None, max_gap_seconds: float | None,
) -> dict[str, Any]:
    """How many windows of ``length`` frames the dataset has, and which anchors gave none."""
    from shardfeed.errors import SchemaError
    from shardfeed.sampling.windows import WindowIndex

    how = ("add them when packing (`shardfeed pack --csv-group COLUMN --csv-order COLUMN`) or "
           "to existing TFRecords (`shardfeed index --group-key FEATURE --order-key FEATURE`)")
    if groups is None and order is None:
        raise SchemaError(f"the dataset has no group ids or order keys, so it has no windows: "
                          f"{how}")
    if order is None and (stride_seconds is not None or max_gap_seconds is not None):
        raise SchemaError(f"the dataset has no order keys (times), which --stride-seconds and "
                          f"--max-gap-seconds need: {how}, or use --stride in records")
    index = WindowIndex.build(groups, order, length=length, stride=stride,
                              stride_seconds=stride_seconds, max_gap_seconds=max_gap_seconds)
    excluded = index.excluded
    count = len(index)
    stats: dict[str, Any] = {
        "length": length, "stride": index.stride, "stride_seconds": index.stride_seconds,
        "tolerance_seconds": index.tolerance_seconds, "max_gap_seconds": index.max_gap_seconds,
        "count": count, "index_bytes": index.nbytes,
        "excluded": {"group_end": excluded.group_end, "gap": excluded.gap,
                     "missing_time": excluded.missing_time, "off_grid": excluded.off_grid,
                     "total": excluded.total},
    }
    if groups is not None:
        all_groups = np.unique(np.asarray(groups)).size
        with_windows = 0
        if count:
            last = index.last_frames(np.arange(count, dtype=np.int64))
            with_windows = int(np.unique(np.asarray(groups)[last]).size)
        stats["groups"] = int(all_groups)
        stats["groups_without_windows"] = int(all_groups - with_windows)
    return stats


def inspect(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, records: int = 0,
    windows: int | None = None, stride: int = 1, stride_seconds: float | None = None,
    max_gap_seconds: float | None = None, allow_outside_paths: bool = False,
    cache_dir: str | os.PathLike[str] | None = None, trust_cache_dir: bool = False,
) -> dict[str, Any]:
    """Describe a dataset as a JSON-serialisable dict.

    ``source``: what ``Dataset`` opens, local or at a URL; a list may also hold folders and
    globs (a command's several arguments), whose files are then described together.

    Keys: ``source``, ``manifest`` (path or None), ``mode``, ``root``, ``shards`` (path,
    records, bytes each), ``records``, ``bytes``, ``schema`` (one row a feature: name, kind,
    length, role, image encoding), ``groups`` (count, records per group min/median/max, order
    key span; None without groups), ``extra`` (class names, vocabularies), and with
    ``records=N`` the first N records, briefly (``first_records``). With ``cache_dir`` (a
    Dataset's disk cache folder), ``cache``: what that folder holds of these records
    (:meth:`Dataset.cached_in`; ``trust_cache_dir``: a folder other users can write).

    ``windows=K`` (with ``stride`` records, or ``stride_seconds`` and ``max_gap_seconds``)
    adds ``windows``: the number of valid windows of K frames (``count``), the anchors that
    gave none by reason (``excluded``: group ends, gaps, missing times, off the time grid),
    and how many groups have no window. Raises SchemaError when the dataset has no groups
    and no order keys.

    A manifest naming shards, sidecars or an image root outside the dataset raises
    :class:`~shardfeed.errors.UnsafePathError` unless ``allow_outside_paths`` (as ``Dataset``).
    """
    _check_arguments(records=records, windows=windows)
    resolved = resolve_sources(source, allow_outside_paths=allow_outside_paths)
    result: dict[str, Any] = {"source": os.fspath(source) if isinstance(source, (str, os.PathLike))
                              else [os.fspath(s) for s in source]}
    shard_paths = list(resolved.urls)
    manifest, base = resolved.manifest, resolved.base
    if manifest is not None and base is not None:
        contents = _from_manifest(resolved, manifest, base,
                                  allow_outside_paths=allow_outside_paths)
    else:
        contents = _from_tfrecords(shard_paths)
    result.update(contents.header)
    result["shards"] = contents.shards
    result["records"] = sum(s["records"] for s in contents.shards)
    result["bytes"] = sum(s["bytes"] for s in contents.shards)
    result["schema"] = _schema_rows(contents.schema)
    result["groups"] = contents.group_stats
    result["extra"] = contents.extra
    if windows is not None:
        result["windows"] = _window_stats(
            contents.groups, contents.order, length=windows, stride=stride,
            stride_seconds=stride_seconds, max_gap_seconds=max_gap_seconds,
        )
    if records:
        result["first_records"] = _first_records(shard_paths, records)
    if cache_dir is not None:
        from shardfeed.dataset import Dataset

        with Dataset(source, allow_outside_paths=allow_outside_paths) as ds:
            result["cache"] = ds.cached_in(cache_dir, trust_cache_dir=trust_cache_dir)
    return result


@dataclass(frozen=True, slots=True)
class _Contents:
    """What the manifest (or the shards themselves) say a dataset holds."""

    header: dict[str, Any]  # manifest, mode, root, group_key, order_key, in that order
    shards: list[dict[str, Any]]
    schema: Any
    extra: dict[str, Any]
    groups: np.ndarray | None
    order: np.ndarray | None
    group_stats: dict[str, Any] | None


def _check_arguments(*, records: int, windows: int | None) -> None:
    """Refuse a negative ``records`` and a ``windows`` that is not a number of frames."""
    if records < 0:
        raise ValueError(f"records must be >= 0, got {records}")
    if windows is not None and (isinstance(windows, bool) or not isinstance(windows, int)
                                or windows < 1):
        raise ValueError(f"windows must be a number of frames >= 1, got {windows!r}")


def _from_manifest(resolved: Resolved, manifest: Manifest, base: str, *,
                   allow_outside_paths: bool) -> _Contents:
    """A packed or indexed dataset: everything from its manifest and sidecars."""
    from shardfeed.format.manifest import load_sidecars

    shards = [{"path": s.path, "records": s.records, "bytes": s.bytes}
              for s in manifest.shards]
    groups, order = load_sidecars(manifest, base, allow_outside=allow_outside_paths)
    header = {
        "manifest": resolved.manifest_url, "mode": manifest.mode,
        "root": None if manifest.root is None else str(referenced_root(
            resolved, None, allow_outside_paths=allow_outside_paths)),
        "group_key": manifest.group_key, "order_key": manifest.order_key,
        "dataset_version": manifest.dataset_version,
    }
    return _Contents(header=header, shards=shards, schema=manifest.schema,
                     extra=dict(manifest.extra), groups=groups, order=order,
                     group_stats=_group_stats(groups, order))


def _from_tfrecords(shard_paths: Sequence[str]) -> _Contents:
    """Bare TFRecord files: offsets from their indexes (or a scan), the schema inferred from
    the first records."""
    from shardfeed.format.schema import infer_schema

    offsets = [_offsets(p) for p in shard_paths]
    shards = [{"path": p, "records": int(o.size - 1), "bytes": int(o[-1])}
              for p, o in zip(shard_paths, offsets)]
    sample: list[dict[str, Any]] = []
    for p, o in zip(shard_paths, offsets):
        if len(sample) >= SCHEMA_SAMPLE:
            break
        sample += _read_records(p, o, SCHEMA_SAMPLE - len(sample))
    header: dict[str, Any] = {"manifest": None, "mode": "tfrecord", "root": None,
                              "group_key": None, "order_key": None}
    return _Contents(header=header, shards=shards,
                     schema=infer_schema(sample) if sample else None, extra={},
                     groups=None, order=None, group_stats=None)


def _first_records(shard_paths: Sequence[str], records: int) -> list[dict[str, Any]]:
    """The first ``records`` records of the shards, in order, each feature briefly."""
    first: list[dict[str, Any]] = []
    for p in shard_paths:
        if len(first) >= records:
            break
        for rec in _read_records(p, _offsets(p), records - len(first)):
            first.append({k: _brief(v) for k, v in sorted(rec.items())})
    return first
