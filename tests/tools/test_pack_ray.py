"""Packing on Ray (2 local CPUs, started here): the same records in the same order as one
machine's pack of the same rows; a write task killed mid-write is retried without a trace;
index and verify as Ray tasks."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from shardfeed import Dataset, pack
from shardfeed.tools.pack.partition import PARTS_FOLDER, PartSizes
from shardfeed.tools.pack.rows import RowFields


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def small_rows(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        pixels = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
        rows.append({"image": bytes(cv2.imencode(".png", pixels)[1]), "label": i % 10,
                     "name": f"{i:06d}"})
    return rows


FIELDS = RowFields(name="name", labels=["label"])


def payloads(folder: Path) -> tuple[list[str], list[bytes]]:
    with Dataset(str(folder)) as ds:
        return ([s.path for s in ds.manifest.shards],
                ds.read_payloads(range(len(ds))))


def test_a_ray_pack_holds_the_records_of_a_single_machine_pack(
    local_ray: None, tmp_path: Path,
) -> None:
    from shardfeed.tools.ray import pack_ray

    rows = small_rows(20_000)
    pack(rows, tmp_path / "one", fields=FIELDS, records_per_shard=1500)
    manifest = pack_ray(ray.data.from_items(rows, override_num_blocks=8), tmp_path / "ray",
                        fields=FIELDS, records_per_shard=1500)
    assert manifest == str(tmp_path / "ray" / "shardfeed.json")
    _, expected = payloads(tmp_path / "one")
    shards, got = payloads(tmp_path / "ray")
    assert len(got) == 20_000 and got == expected  # byte-identical, in manifest order
    assert len(shards) >= 8  # a partition a block at least
    assert not (tmp_path / "ray" / PARTS_FOLDER).exists()


def test_a_ray_append_adds_a_version_with_the_records_of_a_single_machine_pack(
    local_ray: None, tmp_path: Path,
) -> None:
    from shardfeed.tools.ray import pack_ray

    rows = small_rows(3_000)
    pack(rows[:2_000], tmp_path / "one", fields=FIELDS, records_per_shard=500)
    pack(rows, tmp_path / "whole", fields=FIELDS, records_per_shard=500)
    manifest = pack_ray(ray.data.from_items(rows[2_000:], override_num_blocks=2),
                        tmp_path / "one", fields=FIELDS, records_per_shard=500, append=True)
    assert manifest == str(tmp_path / "one" / "shardfeed.json")
    with Dataset(str(tmp_path / "one")) as grown, Dataset(str(tmp_path / "whole")) as whole:
        assert grown.version == 2 and len(grown) == 3_000
        assert grown.read_payloads(range(3_000)) == whole.read_payloads(range(3_000))
    with Dataset(str(tmp_path / "one"), version=1) as old:
        assert len(old) == 2_000


def test_a_ray_pack_into_object_storage_holds_the_same_records(
    local_ray: None, s3_server: Any, tmp_path: Path,
) -> None:
    from shardfeed.tools.ray import PackSink

    rows = small_rows(2_000)
    pack(rows, tmp_path / "one", fields=FIELDS, records_per_shard=150)
    bucket = s3_server.new_bucket("ray")
    url = f"s3://{bucket}/ds"
    # the tasks' environment points elsewhere: they reach the server by the sink's options
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    sink = PackSink(url, fields=FIELDS, sizes=PartSizes(records=150),
                    storage_options=s3_server.storage_options())
    elsewhere = {"runtime_env": {"env_vars": {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}}}
    ray.data.from_items(rows, override_num_blocks=4).write_datasink(
        sink, ray_remote_args=elsewhere)
    assert sink.manifest == f"{url}/shardfeed.json"
    with Dataset(url) as ds:
        got = ds.read_payloads(range(len(ds)))
    assert got == payloads(tmp_path / "one")[1]
    fs = s3_server.filesystem()
    fs.invalidate_cache()
    assert not [p for p in fs.find(bucket) if PARTS_FOLDER in p]


def test_a_task_killed_mid_write_is_retried_without_a_trace(
    local_ray: None, tmp_path: Path,
) -> None:
    import ray.cloudpickle

    from shardfeed.tools.ray import PackSink

    marker = tmp_path / "died"

    class DiesOnce(PackSink):
        """The write task of partition 1 dies mid-write on its first attempt."""

        def write(self, blocks: Any, ctx: Any) -> dict[str, Any]:
            if ctx.task_idx == 1 and not marker.exists():
                from shardfeed.tools.pack.partition import write_partition

                marker.write_text("killed")

                def rows() -> Any:
                    for block in blocks:
                        accessor = ray.data.block.BlockAccessor.for_block(block)
                        for k, row in enumerate(accessor.iter_rows(public_row_format=True)):
                            if k == 200:  # a shard or so written, the next one open
                                os._exit(1)
                            yield row

                write_partition(rows(), self.output, partition=1, fields=self.fields,
                                sizes=self.sizes, attempt="doomed")
            return super().write(blocks, ctx)

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rows = small_rows(2_000)
    pack(rows, tmp_path / "one", fields=FIELDS, records_per_shard=150)
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    sink = DiesOnce(tmp_path / "ray", fields=FIELDS, sizes=PartSizes(records=150), verify=True)
    ray.data.from_items(rows, override_num_blocks=4).write_datasink(sink)
    assert marker.exists()  # the first attempt did die
    assert payloads(tmp_path / "ray")[1] == payloads(tmp_path / "one")[1]
    left = sorted(os.listdir(tmp_path / "ray"))
    assert not [n for n in left if not n.startswith("shard") and n != "shardfeed.json"]
    assert not [n for n in left if n.endswith(".tmp")]


def test_index_and_verify_run_a_ray_task_a_file(local_ray: None, tmp_path: Path) -> None:
    from shardfeed.format.writer import ShardWriter
    from shardfeed.tools.index import index_files
    from shardfeed.tools.ray import ray_map
    from shardfeed.tools.verify import verify

    for k in range(3):
        with ShardWriter(str(tmp_path / f"f-{k}.tfrecord")) as writer:
            for i in range(50):
                writer.write_example({"label": [k * 50 + i]})
    result = index_files(str(tmp_path), run=ray_map)
    assert result.files == 3 and result.records == 150
    report = verify(str(tmp_path), run=ray_map)
    assert report.ok and len(report.shards) == 3
    with open(tmp_path / "f-1.tfrecord", "r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    assert not verify(str(tmp_path), run=ray_map).ok
