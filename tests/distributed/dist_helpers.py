"""Tiny record-only shards for the distributed and remote tests (no images: fast to start)."""

from __future__ import annotations

from pathlib import Path

from shardfeed.format.writer import ShardWriter

RECORDS = 23


def write_records(folder: Path, n: int, *, shards: int = 2) -> Path:
    """``n`` records holding their index and a name, over ``shards`` shard files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-n // shards)
    for s in range(shards):
        with ShardWriter(str(folder / f"part-{s:03d}.tfrecord")) as writer:
            for i in range(s * per, min(n, (s + 1) * per)):
                writer.write_example({"index": [i], "name": f"r{i}".encode()})
    return folder
