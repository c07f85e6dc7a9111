"""Packing data (arrays, rows) straight into object storage (moto S3 on 127.0.0.1): the same
records as a local pack, parts uploaded then merged, nothing of the parts left, the manifest
written last; partitions written by separate attempts merge as they do on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed import Dataset, pack
from shardfeed.errors import PackError
from shardfeed.tools.pack.partition import (
    PARTS_FOLDER,
    PartSizes,
    merge_partitions,
    write_partition,
)
from shardfeed.tools.pack.rows import RowFields


def arrays(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return (rng.integers(0, 256, (n, 8, 10, 3), dtype=np.uint8),
            rng.integers(0, 5, n).astype(np.int64))


def records(source: str) -> list[bytes]:
    with Dataset(source) as ds:
        return ds.read_payloads(range(len(ds)))


def objects(s3_server: Any, bucket: str) -> list[str]:
    fs = s3_server.filesystem()
    fs.invalidate_cache()
    return sorted(p.split("/", 1)[1] for p in fs.find(bucket))


def test_data_packed_to_s3_holds_the_records_of_a_local_pack(s3_server: Any,
                                                            tmp_path: Path) -> None:
    images, labels = arrays(30)
    bucket = s3_server.new_bucket("rows")
    url = f"s3://{bucket}/ds"
    pack((images, labels), url, records_per_shard=7, progress=False)
    pack((images, labels), tmp_path / "local", records_per_shard=7, progress=False)
    assert records(url) == records(str(tmp_path / "local"))
    with Dataset(url) as ds:
        got = [ds[i] for i in (0, 17, 29)]
    assert [int(r["label"][0]) for r in got] == [int(labels[i]) for i in (0, 17, 29)]
    names = objects(s3_server, bucket)
    assert not any(PARTS_FOLDER in n for n in names)  # the parts were renamed, none left
    assert sum(n.endswith(".tfrecord") for n in names) == 5  # 30 records, 7 a shard
    puts = [r.path.rsplit("/", 1)[-1] for r in s3_server.requests("PUT")]
    assert puts[-1] == "shardfeed.json"  # the manifest last: no dataset before it is whole
    with pytest.raises(PackError, match="not empty"):
        pack((images, labels), url, progress=False)
    pack((images[:10], labels[:10]), url, records_per_shard=4, overwrite=True, progress=False)
    assert records(url) == records(str(tmp_path / "local"))[:10]
    assert sum(n.endswith(".tfrecord") for n in objects(s3_server, bucket)) == 3


def test_a_bad_row_leaves_the_prefix_as_it_was(s3_server: Any) -> None:
    bucket = s3_server.new_bucket("bad")
    rows: list[dict[str, Any]] = [{"image": b"\x89PNG\r\n\x1a\n" + bytes(40), "label": 1}] * 3
    good = {"image": arrays(1)[0][0], "label": 0}
    with pytest.raises(PackError, match="row 2"):
        pack([good, good, *rows], f"s3://{bucket}/ds", records_per_shard=1, progress=False,
             fields=RowFields(labels=["label"]))
    assert objects(s3_server, bucket) == []  # the uploaded parts were removed


def test_partitions_written_to_s3_by_separate_attempts_merge_into_one_dataset(
    s3_server: Any, tmp_path: Path,
) -> None:
    images, labels = arrays(24)
    rows = [{"image": images[i], "label": int(labels[i])} for i in range(24)]
    fields = RowFields(labels=["label"])
    sizes = PartSizes(records=5)
    bucket = s3_server.new_bucket("parts")
    url = f"s3://{bucket}/ds"
    partials = [write_partition(rows[8 * p: 8 * p + 8], url, partition=p, fields=fields,
                                sizes=sizes, attempt="b") for p in (2, 0, 1)]
    # a speculative copy of partition 1 that finished later, and one killed after a part
    partials.append(write_partition(rows[8:16], url, partition=1, fields=fields, sizes=sizes,
                                    attempt="c"))
    write_partition(rows[8:13], url, partition=1, fields=fields, sizes=sizes, attempt="a-dead")
    manifest = merge_partitions(url, [p.to_json() for p in partials], partitions=3, verify=True)
    assert manifest == f"{url}/shardfeed.json"
    pack(rows, tmp_path / "one", fields=fields, progress=False)
    assert records(url) == records(str(tmp_path / "one"))  # partition order, not write order
    assert not any(PARTS_FOLDER in n for n in objects(s3_server, bucket))


def test_a_merge_on_s3_refuses_a_part_that_changed(s3_server: Any) -> None:
    images, labels = arrays(6)
    rows = [{"image": images[i], "label": int(labels[i])} for i in range(6)]
    bucket = s3_server.new_bucket("changed")
    url = f"s3://{bucket}/ds"
    part = write_partition(rows, url, partition=0, fields=RowFields(labels=["label"]))
    fs = s3_server.filesystem()
    path = f"{bucket}/ds/{part.shards[0].path}"
    data = bytearray(fs.cat_file(path))
    data[100] ^= 1
    fs.pipe_file(path, bytes(data))
    with pytest.raises(PackError, match="CRC32C"):
        merge_partitions(url, [part], verify=True)
    fs.pipe_file(path, bytes(data[:-1]))
    with pytest.raises(PackError, match="bytes, its partial says"):
        merge_partitions(url, [part])
    assert not fs.exists(f"{bucket}/ds/shardfeed.json")
