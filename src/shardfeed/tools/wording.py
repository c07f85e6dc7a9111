"""Words for numbers in the text the commands print: ``1 shard``, ``2 shards``, ``3 classes``.

One helper, used by every command's output (the command line re-exports it as
``shardfeed.cli.common.count``) and by the text the tools build themselves (the demo summary).
"""

from __future__ import annotations

__all__ = ["count"]

_ADDS_ES = ("s", "x", "z", "ch", "sh")  # class -> classes, batch -> batches


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with thousands separators and ``noun``, plural unless ``n`` is 1.

    ``count(1, "shard")`` is ``1 shard``, ``count(1200, "record")`` is ``1,200 records``,
    ``count(3, "class")`` is ``3 classes``; give ``plural`` for any other irregular noun.
    """
    if n == 1:
        return f"{n:,} {noun}"
    if plural is None:
        plural = noun + ("es" if noun.endswith(_ADDS_ES) else "s")
    return f"{n:,} {plural}"
