"""compact: the small shards of many appends merged into the next version, the records, their
order and the fingerprint unchanged, so a run's state restores on it and gives the same
batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import shardfeed
from shardfeed.errors import PackError
from shardfeed.format.manifest import ShardInfo
from shardfeed.tools.pack import pack
from shardfeed.tools.pack.compact import compact, plan_runs

SRC = Path(__file__).resolve().parents[2] / "src"


def _grown(tmp_path: Path, make_image: Any, appends: int = 6) -> Path:
    out = tmp_path / "out"
    first = tmp_path / "first"
    for i in range(12):
        make_image(first / f"c{i % 3}" / f"a{i}.jpg", i)
    pack(first, out, records_per_shard=4)
    for k in range(appends):
        day = tmp_path / f"day{k}"
        for i in range(2):
            make_image(day / f"c{i % 3}" / f"d{k}-{i}.jpg", 100 + 10 * k + i)
        pack(day, out, append=True, records_per_shard=4)
    return out


def _stream(out: Path, state: Any = None, version: int | None = None) -> list[list[bytes]]:
    with shardfeed.Loader(shardfeed.Dataset(str(out), version=version), batch_size=5, seed=2,
                          transform=None) as loader:
        if state is not None:
            loader.restore(state)
        return [list(b["image/filename"]) for b in loader]


def test_runs_of_small_shards_are_planned_in_order() -> None:
    def shards(*sizes: int) -> list[ShardInfo]:
        return [ShardInfo(path=f"s{k}", records=1, bytes=b) for k, b in enumerate(sizes)]

    assert plan_runs(shards(100, 10, 10, 10, 100, 10), 100, by_records=False) == [range(1, 4)]
    assert plan_runs(shards(10, 10, 40, 45, 10), 100, by_records=False) == [
        range(3), range(3, 5)]
    assert plan_runs(shards(60, 10, 60), 100, by_records=False) == []  # nothing to merge


def test_compact_keeps_the_records_their_order_and_the_fingerprint(
        tmp_path: Path, make_image: Any) -> None:
    out = _grown(tmp_path, make_image)
    with shardfeed.Dataset(str(out)) as before:
        fingerprint, version, payloads = (before.fingerprint, before.version,
                                          before.read_payloads(range(len(before))))
        shards = before.num_shards
    with shardfeed.Loader(shardfeed.Dataset(str(out)), batch_size=5, seed=2,
                          transform=None) as run:
        batches = iter(run)
        next(batches)
        state = json.loads(json.dumps(run.state()))  # a run's state, mid-epoch
    expected = _stream(out, state)
    result = compact(out, target=8, by_records=True)
    assert result.version == version + 1 and not result.already_complete
    with shardfeed.Dataset(str(out)) as after:
        assert after.version == version + 1 and after.num_shards < shards
        assert after.fingerprint == fingerprint
        assert after.read_payloads(range(len(after))) == payloads  # byte for byte, in order
    assert _stream(out, state) == expected  # the state restores on the compacted version
    with shardfeed.Dataset(str(out), version=version) as old:  # the old version stays
        assert old.num_shards == shards
    again = compact(out, target=8, by_records=True)
    assert again.already_complete and again.version == version + 1


def test_compact_from_the_command_line_and_its_refusals(tmp_path: Path,
                                                         make_image: Any) -> None:
    out = _grown(tmp_path, make_image, appends=3)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-m", "shardfeed", "compact", str(out),
                           "--records-per-shard", "8"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "compacted" in done.stdout and "version 5" in done.stdout
    with pytest.raises(PackError, match="no dataset to compact"):
        compact(tmp_path / "nothing", target=8, by_records=True)


def test_a_compact_that_fails_leaves_no_folder_and_can_run_again(
        tmp_path: Path, make_image: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardfeed.format.writer import ShardWriter

    out = _grown(tmp_path, make_image, appends=3)
    real = ShardWriter.write

    def full_disk(self: Any, payload: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ShardWriter, "write", full_disk)
    with pytest.raises(OSError):
        compact(out, target=8, by_records=True)
    monkeypatch.setattr(ShardWriter, "write", real)
    assert not (out / "v5").exists()
    with shardfeed.Dataset(str(out)) as ds:
        assert ds.version == 4
    assert compact(out, target=8, by_records=True).version == 5
