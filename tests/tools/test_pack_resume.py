"""pack --resume checks what it keeps: a shard damaged between the runs is written again; a
finished pack is checked and left as it is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import google_crc32c
import pytest

from shardfeed.cli.main import main
from shardfeed.errors import PackError
from shardfeed.tools.pack import pack

QUIET = ["--no-progress"]
SHARDS = [f"shard-0000{i}-of-00005.tfrecord" for i in range(5)]


class Interrupted(Exception):
    pass


def interrupted_pack(source: Path, out: Path, *, shards: int) -> None:
    """A pack stopped (Ctrl-C, a killed job) after ``shards`` complete shards."""
    done: list[str] = []

    def count(path: str) -> None:
        done.append(path)
        if len(done) == shards:
            raise Interrupted(path)

    with pytest.raises(Interrupted):
        pack(source, out, records_per_shard=2, on_shard=count)


def flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_resume_writes_again_a_shard_damaged_between_the_runs(
    class_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clean = tmp_path / "clean"
    pack(class_folder, clean, records_per_shard=2)
    out = tmp_path / "out"
    interrupted_pack(class_folder, out, shards=3)
    damaged = out / SHARDS[1]
    flip_byte(damaged, damaged.stat().st_size // 2)  # one bit, inside an image

    assert main(["pack", str(class_folder), str(out), "--records-per-shard", "2", "--resume",
                 *QUIET]) == 0
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1
    assert SHARDS[1] in said[0] and "changed since it was written" in said[0]
    for name in SHARDS:  # what resume left is what an uninterrupted pack writes
        assert (out / name).read_bytes() == (clean / name).read_bytes()
    manifest = json.loads((out / "shardfeed.json").read_text())
    for shard in manifest["shards"]:
        assert shard["crc32c"] == google_crc32c.value((out / shard["path"]).read_bytes())
    assert main(["verify", str(out), *QUIET]) == 0


def test_resume_writes_again_a_shard_whose_index_was_damaged(
    class_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clean = tmp_path / "clean"
    pack(class_folder, clean, records_per_shard=2)
    out = tmp_path / "out"
    interrupted_pack(class_folder, out, shards=2)
    index = out / (SHARDS[0] + ".idx")
    *head, last = index.read_text().splitlines()
    offset, size = last.split()
    index.write_text("\n".join([*head, f"{offset} {int(size) + 1}"]) + "\n")
    result = pack(class_folder, out, records_per_shard=2, resume=True)
    assert result.kept_shards == 1
    assert any("indexes that disagree" in r.getMessage() for r in caplog.records)
    assert {n: (out / n).read_bytes() for n in os.listdir(clean)} == {
        n: (clean / n).read_bytes() for n in os.listdir(clean)}


def test_a_shard_finished_but_not_recorded_is_checked_by_its_records(
    class_folder: Path, tmp_path: Path
) -> None:
    """Killed right after a shard's rename, before its line in the plan file: the shard's
    records' CRCs vouch for it."""
    out = tmp_path / "out"
    interrupted_pack(class_folder, out, shards=2)
    plan = out / ".shardfeed-pack.json"
    lines = plan.read_text().splitlines()
    assert len(lines) == 3  # the plan, then one line a finished shard
    plan.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:10])  # the last one cut
    assert pack(class_folder, out, records_per_shard=2, resume=True).kept_shards == 2
    # damaged and not recorded: its records' CRCs catch it
    interrupted = tmp_path / "again"
    interrupted_pack(class_folder, interrupted, shards=2)
    plan = interrupted / ".shardfeed-pack.json"
    plan.write_text(plan.read_text().splitlines()[0] + "\n")
    flip_byte(interrupted / SHARDS[1], 40)
    assert pack(class_folder, interrupted, records_per_shard=2, resume=True).kept_shards == 1
    assert main(["verify", str(interrupted), *QUIET]) == 0


def test_checking_kept_shards_shows_progress(
    class_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    interrupted_pack(class_folder, out, shards=2)
    capsys.readouterr()
    pack(class_folder, out, records_per_shard=2, resume=True, progress=True)
    assert "check kept shards" in capsys.readouterr().err


def test_resume_on_a_finished_pack_says_so_and_changes_nothing(
    class_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["pack", str(class_folder), str(out), "--records-per-shard", "2", *QUIET]
    assert main(args) == 0
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    said = capsys.readouterr()
    assert said.out.startswith("already complete: 9 records in 5 shards")
    assert said.err == ""
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
    # a shard damaged since: resume says which, and changes nothing either
    flip_byte(out / SHARDS[3], 30)
    assert main([*args, "--resume"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and SHARDS[3] in err[0] and "--overwrite" in err[0]
    # other options: not the pack that finished there
    with pytest.raises(PackError, match="other inputs or options"):
        pack(class_folder, out, records_per_shard=3, resume=True)
