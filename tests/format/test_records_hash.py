"""The records hash: the same records in the same order give the same hash and fingerprint
however the shards are cut; another order, or one changed record, gives another."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed import Dataset
from shardfeed.format.manifest import Manifest
from shardfeed.format.records_hash import RecordsHash, combine, hash_of_shard
from shardfeed.format.writer import ShardWriter


def _write(folder: Path, payloads: list[bytes], cuts: list[int]) -> Path:
    """``payloads`` into shards cut before each index of ``cuts``, with a manifest."""
    folder.mkdir()
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(payloads)}), len(payloads)]
    infos = []
    for k, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        with ShardWriter(folder / f"s-{k:03d}.tfrecord") as writer:
            for payload in payloads[lo:hi]:
                writer.write(payload)
        infos.append(writer.close())
    Manifest(shards=infos, schema=None, mode="tfrecord").save(folder / "shardfeed.json")
    return folder


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 40), st.integers(0, (1 << 32) - 1)),
                max_size=40),
       st.lists(st.integers(0, 40), max_size=5))
def test_parts_combine_to_the_hash_of_the_whole(records: list[tuple[int, int]],
                                                cuts: list[int]) -> None:
    whole = RecordsHash()
    for length, crc in records:
        whole.add(length, crc)
    bounds = [0, *sorted({c for c in cuts if c < len(records)}), len(records)]
    parts = []
    for lo, hi in itertools.pairwise(bounds):
        part = RecordsHash()
        for length, crc in records[lo:hi]:
            part.add(length, crc)
        parts.append((part.value, part.count))
    assert combine(parts) == (whole.value, whole.count)


def test_the_writer_and_the_file_agree(tmp_path: Path) -> None:
    payloads = [bytes([i]) * (i * 7 % 50) for i in range(30)]
    folder = _write(tmp_path / "ds", payloads, [])
    info = Manifest.load(folder / "shardfeed.json").shards[0]
    offsets = np.load(folder / "s-000.tfrecord.idx.npy")
    assert info.records_hash == hash_of_shard(str(folder / "s-000.tfrecord"), offsets)


def test_a_fingerprint_follows_the_records_not_the_cuts(tmp_path: Path) -> None:
    payloads = [f"record {i}".encode() * (1 + i % 3) for i in range(24)]

    def fingerprint(name: str, records: list[bytes], cuts: list[int]) -> str:
        with Dataset(str(_write(tmp_path / name, records, cuts))) as ds:
            return ds.fingerprint

    one = fingerprint("one", payloads, [])
    assert one.startswith("records:")
    assert fingerprint("three", payloads, [8, 16]) == one
    assert fingerprint("ragged", payloads, [1, 2, 23]) == one
    swapped = [*payloads[:5], payloads[6], payloads[5], *payloads[7:]]
    assert fingerprint("swapped", swapped, [8, 16]) != one
    changed = [*payloads[:10], b"record X", *payloads[11:]]
    assert fingerprint("changed", changed, []) != one
    assert fingerprint("fewer", payloads[:-1], []) != one
