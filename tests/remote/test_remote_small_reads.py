"""Shuffled reads of a few records a shard from object storage: the records asked, in the
order asked, the same as from the local copy, whatever the mix of shards and group sizes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shardfeed import Dataset


def test_shuffled_small_reads_match_the_local_copy(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    folder = records_dataset(700, 7)
    url = s3_server.upload_folder(folder)
    rng = np.random.default_rng(0)
    sets = [
        [], [0], [699], [5, 5, 4], [600, 3, 601, 3],
        rng.permutation(700)[:32].tolist(),  # one or two records of most shards
        rng.integers(0, 700, 300).tolist(),  # duplicates; groups of about 40
        list(range(99, 205))[::-1],  # one shard whole and parts of two
        rng.integers(0, 700, 1500).tolist(),
    ]
    with Dataset(url) as remote, Dataset(folder) as local:
        for idx in sets:
            expected = [local.read_payloads([i])[0] for i in idx]
            assert remote.read_payloads(idx) == expected
            assert local.read_payloads(idx) == expected
        decoded = remote.read_many(sets[5])
        assert [int(r["index"][0]) for r in decoded] == sets[5]
