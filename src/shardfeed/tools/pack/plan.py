"""The pack planner: which item goes to which shard, decided before anything is written.

::

    items (input order)  --sort by (group, order key, input row)-->  write order
    write order          --cut where a shard would pass its size-->  shards

        group 0           group 1              group 2
    |a0 a1 a2 a3 a4 | a5 a6 b0 b1 b2 | b3 c0 c1 c2 c3 |   <- shards of <= N records / bytes
       sorted by order key inside each group; groups in sorted order, contiguous

Determinism: the plan is a function of the items, their estimated sizes and the options
only (never of timing or worker count), so an interrupted pack can check what it kept and
resume. ``PackPlan.digest`` fingerprints everything that decides the output bytes;
``ShardPlan.digest`` (when the items' fingerprint lines are given) everything that decides
one shard's bytes, so that a resume after the inputs changed (a bad file fixed or removed)
keeps the shards that come out the same.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardfeed.format import spec


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """One shard of the plan: write-order positions ``[start, stop)`` into file ``name``."""

    index: int
    name: str
    start: int
    stop: int
    digest: str = ""

    @property
    def records(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class PackPlan:
    """The write order (item indices) and the shards cut from it."""

    order: tuple[int, ...]
    shards: tuple[ShardPlan, ...]
    digest: str
    options_digest: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "options": self.options_digest,
            "shards": [
                {"name": s.name, "records": s.records, "digest": s.digest} for s in self.shards
            ],
        }


def shard_name(prefix: str, index: int, count: int) -> str:
    """``prefix-00003-of-00012.tfrecord``, the TensorFlow naming convention."""
    return f"{prefix}-{index:05d}-of-{count:05d}{spec.SHARD_SUFFIX}"


def sort_key(group: int | None, order: float | None, row: int) -> tuple[int, float, int]:
    """Records sort by group id, then order key, then input row (ties keep input order).

    The order key may be an int (``pack`` gives nanoseconds: exact, where float seconds
    could tie two frames a microsecond apart)."""
    return (0 if group is None else group, 0 if order is None else order, row)


def plan_shards(
    keys: Sequence[tuple[int, float, int]],
    sizes: Sequence[int],
    *,
    records_per_shard: int | None = None,
    shard_bytes: int | None = None,
    prefix: str = "shard",
    fingerprint: Any = None,
    item_lines: Sequence[str] | None = None,
) -> PackPlan:
    """Plan the shards.

    ``keys[i]`` is item i's sort key (see :func:`sort_key`), ``sizes[i]`` its estimated
    record size in bytes. Shards hold ``records_per_shard`` records each, or as many as fit
    in ``shard_bytes`` (at least one). ``fingerprint`` is any JSON-serialisable description
    of the inputs and options; it goes into the digest with the plan itself.
    ``item_lines[i]``, when given, fingerprints item i's record; each shard's digest covers
    ``fingerprint``, its name and its items' lines, in write order.
    """
    _check_arguments(keys, sizes, records_per_shard=records_per_shard,
                     shard_bytes=shard_bytes, prefix=prefix)
    order = tuple(sorted(range(len(keys)), key=keys.__getitem__))
    bounds = _shard_bounds(order, sizes, records_per_shard=records_per_shard,
                           shard_bytes=shard_bytes)
    if item_lines is not None and len(item_lines) != len(keys):
        raise ValueError(f"plan_shards got {len(keys)} keys but {len(item_lines)} item lines")
    options = _digest(fingerprint)
    shards = tuple(
        ShardPlan(
            index=i, name=shard_name(prefix, i, len(bounds)), start=a, stop=b,
            digest="" if item_lines is None else _digest(
                [options, shard_name(prefix, i, len(bounds)),
                 [item_lines[order[p]] for p in range(a, b)]]
            ),
        )
        for i, (a, b) in enumerate(bounds)
    )
    digest = _digest({
        "fingerprint": fingerprint,
        "order": order,
        "shards": [[s.name, s.start, s.stop] for s in shards],
        **({"items": _digest(list(item_lines))} if item_lines is not None else {}),
    })
    return PackPlan(order=order, shards=shards, digest=digest, options_digest=options)


def _check_arguments(
    keys: Sequence[tuple[int, float, int]], sizes: Sequence[int], *,
    records_per_shard: int | None, shard_bytes: int | None, prefix: str,
) -> None:
    """One key and one size an item, exactly one shard size, a plain prefix."""
    if len(keys) != len(sizes):
        raise ValueError(f"plan_shards got {len(keys)} keys but {len(sizes)} sizes")
    if (records_per_shard is None) == (shard_bytes is None):
        raise ValueError("give exactly one of records_per_shard or shard_bytes")
    if records_per_shard is not None and records_per_shard < 1:
        raise ValueError(f"records_per_shard must be >= 1, got {records_per_shard}")
    if shard_bytes is not None and shard_bytes < 1:
        raise ValueError(f"shard_bytes must be >= 1, got {shard_bytes}")
    if not prefix or "/" in prefix:
        raise ValueError(f"shard prefix must be a plain file name part, got {prefix!r}")


def _shard_bounds(
    order: Sequence[int], sizes: Sequence[int], *, records_per_shard: int | None,
    shard_bytes: int | None,
) -> list[tuple[int, int]]:
    """Each shard's ``(start, stop)`` positions in ``order``: ``records_per_shard`` records,
    or as many as fit in ``shard_bytes`` (at least one)."""
    if records_per_shard is not None:
        return [
            (a, min(a + records_per_shard, len(order)))
            for a in range(0, len(order), records_per_shard)
        ]
    bounds: list[tuple[int, int]] = []
    limit = int(shard_bytes or 0)
    start, used = 0, 0
    for pos, item in enumerate(order):
        size = int(sizes[item])
        if pos > start and used + size > limit:
            bounds.append((start, pos))
            start, used = pos, 0
        used += size
    if start < len(order):
        bounds.append((start, len(order)))
    return bounds


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3,
          "GB": 1000**3, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3}


def parse_size(text: str | int) -> int:
    """A byte size: ``64MB`` (10^6), ``64MiB`` (2^20), ``1.5G``, or a plain integer."""
    if isinstance(text, int):
        if text < 1:
            raise ValueError(f"size must be >= 1 byte, got {text}")
        return text
    value = text.strip().upper().replace(" ", "")
    number = value.rstrip("KMGIB")
    unit = value[len(number):]
    if unit not in _UNITS or not number:
        raise ValueError(
            f"size {text!r} is not understood; write e.g. 64MB, 64MiB, 1GB or 500000"
        )
    try:
        size = int(float(number) * _UNITS[unit])
    except ValueError:
        raise ValueError(f"size {text!r} is not understood; write e.g. 64MB or 1GB") from None
    if size < 1:
        raise ValueError(f"size must be >= 1 byte, got {text!r}")
    return size
