"""A dataset on object storage names only objects under its own bucket and prefix."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardfeed import Dataset
from shardfeed.errors import UnsafePathError


def _with_shard_path(folder: Path, tmp_path: Path, name: str) -> Path:
    """A copy of ``folder`` whose manifest names its second shard ``name``."""
    copy = tmp_path / "ds"
    shutil.copytree(folder, copy)
    doc = json.loads((copy / "shardfeed.json").read_text())
    doc["shards"][1]["path"] = name
    (copy / "shardfeed.json").write_text(json.dumps(doc))
    return copy


def test_a_manifest_naming_another_bucket_is_refused_before_any_request_to_it(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    other = s3_server.upload_folder(records_dataset(40, 2), prefix="private")
    hostile = _with_shard_path(records_dataset(40, 2), tmp_path,
                               f"{other}/part-001.tfrecord")
    url = s3_server.upload_folder(hostile)
    s3_server.clear_log()
    with pytest.raises(UnsafePathError, match="allow_outside_paths") as caught:
        Dataset(url)
    assert other in str(caught.value)
    bucket = other.removeprefix("s3://").split("/")[0]
    assert not [r for r in s3_server.requests() if bucket in r.path]

    with Dataset(url, allow_outside_paths=True) as ds:  # the user trusts it
        assert len(ds) == 40 and ds.shard_urls[1] == f"{other}/part-001.tfrecord"


@pytest.mark.parametrize("name", ["../../other/part-001.tfrecord", "/etc/part-001.tfrecord",
                                  "http://127.0.0.1:9/part-001.tfrecord"])
def test_a_manifest_leaving_its_prefix_is_refused(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path, name: str
) -> None:
    url = s3_server.upload_folder(_with_shard_path(records_dataset(40, 2), tmp_path, name))
    with pytest.raises(UnsafePathError) as caught:
        Dataset(url)
    assert name in str(caught.value) and url in str(caught.value)
