"""A state saved on local shards restores on the same shards on object storage (moto on
127.0.0.1), through their manifest or as a list of URLs; other shards are refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import write_records

from shardfeed import Dataset, Loader, StateError
from shardfeed.format.writer import ShardWriter
from shardfeed.tools.index import index_files

OPTIONS: dict[str, Any] = {"batch_size": 4, "seed": 7, "transform": None, "num_threads": 2,
                           "rank": 0, "world_size": 1}


def indices(loader: Loader) -> list[int]:
    return [i for batch in loader for i in batch["index"].tolist()]


def saved_after(ds: Dataset, batches: int) -> dict[str, Any]:
    with Loader(ds, **OPTIONS) as loader:
        it = iter(loader)
        for _ in range(batches):
            next(it)
        return json.loads(json.dumps(loader.state()))


def test_a_local_state_continues_on_the_s3_copy(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    folder = records_dataset(36, 3)
    url = s3_server.upload_folder(folder)
    with Dataset(str(folder)) as local, Loader(local, **OPTIONS) as reference:
        whole = indices(reference)
        state = saved_after(local, 3)
        files = [str(p) for p in sorted(folder.glob("*.tfrecord"))]
    with Dataset(files) as local_files:
        files_state = saved_after(local_files, 3)
    with Dataset(url) as remote, Loader(remote, **OPTIONS) as loader:  # through the manifest
        loader.restore(state)
        assert indices(loader) == whole[12:]
    urls = [f"{url}/{Path(f).name}" for f in files]
    with Dataset(urls) as remote_files, Loader(remote_files, **OPTIONS) as loader:  # bare files
        loader.restore(files_state)
        assert indices(loader) == whole[12:]


def test_other_shards_on_s3_are_refused(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    folder = records_dataset(36, 3)
    with Dataset(str(folder)) as local, Loader(local, **OPTIONS) as reference:
        whole = indices(reference)
        state = saved_after(local, 1)
    # the same 36 records cut into one shard fewer: other offsets and sizes, the same stream
    recut = write_records(tmp_path / "recut", 36, shards=2)
    index_files(str(recut))
    with Dataset(s3_server.upload_folder(recut)) as remote, Loader(remote, **OPTIONS) as loader:
        loader.restore(state)
        assert indices(loader) == whole[4:]
    # 36 other records under the same names: refused
    other = tmp_path / "other"
    other.mkdir()
    for s in range(3):
        with ShardWriter(str(other / f"part-{s:03d}.tfrecord")) as writer:
            for i in range(12 * s, 12 * s + 12):
                writer.write_example({"index": [35 - i], "name": f"r{35 - i}".encode()})
    index_files(str(other))
    url = s3_server.upload_folder(other)
    with Dataset(url) as remote, Loader(remote, **OPTIONS) as loader, \
            pytest.raises(StateError, match=r"\['dataset'\] is 'records:"):
        loader.restore(state)
