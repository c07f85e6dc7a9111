"""shardfeed cache: what a cache folder holds, --verify, --clear, a folder that is not one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardfeed.cli.main import main
from shardfeed.storage.disk_cache import DiskCache


def fill(folder: Path) -> None:
    cache = DiskCache(folder, max_bytes=10_000)
    cache.put_many([(f"k{i}", f"s3://b/part-{i % 2}.tfrecord", b"x" * 100, i) for i in range(6)])
    cache.close()


def test_cache_lists_entries_and_objects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fill(tmp_path / "c")
    assert main(["cache", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "6 entries, 600 B of" in out and "s3://b/part-0.tfrecord" in out
    assert main(["cache", str(tmp_path / "c"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["entries"], report["bytes"], report["max_bytes"]) == (6, 600, 10_000)
    assert sorted(o["url"] for o in report["objects"]) == ["s3://b/part-0.tfrecord",
                                                          "s3://b/part-1.tfrecord"]


def test_cache_verify_removes_damaged_entries_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill(tmp_path / "c")
    (tmp_path / "c" / "data" / "k3" / "k3.rec").write_bytes(b"rotten")
    assert main(["cache", str(tmp_path / "c"), "--verify"]) == 1
    assert "1 damaged entries removed" in capsys.readouterr().out
    assert main(["cache", str(tmp_path / "c"), "--verify", "--clear"]) == 0
    assert "5 entries" in capsys.readouterr().out
    assert main(["cache", str(tmp_path / "c"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 0


def test_cache_of_a_folder_that_is_not_one(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", str(tmp_path)]) == 1
    assert "not a shardfeed cache folder" in capsys.readouterr().err
