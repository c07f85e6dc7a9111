"""verify reports an index a Dataset would refuse (damaged or with wild offsets) instead of
passing the shard."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from shardfeed.format.framing import scan
from shardfeed.tools.verify import report as V
from shardfeed.tools.verify import verify


@pytest.mark.parametrize("damage", ["wild offset", "not an index"])
def test_verify_reports_a_damaged_index(tf_fixtures: Path, tmp_path: Path, damage: str) -> None:
    shard = tmp_path / "m.tfrecord"
    shutil.copy(tf_fixtures / "mixed.tfrecord", shard)
    offsets = scan(shard)
    index = tmp_path / "m.tfrecord.idx.npy"
    if damage == "wild offset":
        offsets[3] = 1 << 62  # count and end still match the file
        np.save(index, offsets)
    else:
        index.write_bytes(b"garbage")
    report = verify(shard)
    assert not report.ok
    assert [p.kind for p in report.problems] == [V.INDEX_MISMATCH]
    assert "m.tfrecord.idx.npy" in report.problems[0].detail
    index.unlink()
    assert verify(shard).ok
