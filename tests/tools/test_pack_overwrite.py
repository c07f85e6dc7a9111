"""pack --overwrite removes what an earlier pack wrote and nothing else; it never writes over
a file it did not write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardfeed import Dataset
from shardfeed.cli.main import main
from shardfeed.format.example import encode_example
from shardfeed.format.framing import frame
from shardfeed.format.writer import ShardWriter
from shardfeed.tools.pack import pack

QUIET = ["--no-progress"]


def files_in(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_overwrite_keeps_the_users_own_files_and_says_so(
    class_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    assert main(["pack", str(class_folder), str(out), "--records-per-shard", "4", *QUIET]) == 0
    first_pack = set(os.listdir(out))
    # the user keeps their own records (indexed, as DALI's tfrecord2idx would) and notes there
    with ShardWriter(out / "important.tfrecord") as writer:
        writer.write(encode_example({"label": 7}))
    (out / "notes.txt").write_text("run 3 used the new photos\n")
    mine = files_in(out)
    mine = {n: b for n, b in mine.items() if n.startswith(("important", "notes"))}
    assert len(mine) == 4

    assert main(["pack", str(class_folder), str(out), "--records-per-shard", "2",
                 "--overwrite", *QUIET]) == 0
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1 and "keeps 4 files pack did not write" in said[0]
    assert "important.tfrecord" in said[0] and "notes.txt" in said[0]
    after = files_in(out)
    for name, data in mine.items():  # byte-identical
        assert after[name] == data
    # the earlier pack's shards (3 of them) are gone, the new pack's 5 are there
    assert not {n for n in first_pack if "-of-00003" in n} & set(after)
    assert len([n for n in after if n.endswith("-of-00005.tfrecord")]) == 5
    with Dataset(str(out)) as ds:
        assert len(ds) == 9
    # and once more: the second pack recorded what it wrote, the user's files stay again
    assert main(["pack", str(class_folder), str(out), "--overwrite", *QUIET]) == 0
    assert {n: (out / n).read_bytes() for n in mine} == mine
    assert not [n for n in os.listdir(out) if "-of-00005" in n]


def test_pack_refuses_to_write_over_a_file_it_did_not_write(
    class_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "shard-00000-of-00005.tfrecord").write_bytes(frame(encode_example({"label": 1})))
    (out / "notes.txt").write_text("mine")
    before = files_in(out)
    assert main(["pack", str(class_folder), str(out), "--records-per-shard", "2",
                 "--overwrite", *QUIET]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "shard-00000-of-00005.tfrecord" in err[0] and "does not overwrite" in err[0]
    assert "--prefix" in err[0]
    assert files_in(out) == before  # nothing removed, nothing written
    # another prefix packs beside them
    assert main(["pack", str(class_folder), str(out), "--records-per-shard", "2",
                 "--prefix", "photos", "--overwrite", *QUIET]) == 0
    assert {n: (out / n).read_bytes() for n in before} == before


def test_overwrite_of_a_folder_indexed_in_place_removes_nothing(
    class_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tf"
    out.mkdir()  # TFRecords another tool wrote, indexed where they are
    (out / "train-00000-of-00001.tfrecord").write_bytes(
        b"".join(frame(encode_example({"label": i})) for i in range(3)))
    assert main(["index", str(out), *QUIET]) == 0
    before = files_in(out)
    assert "shardfeed.json" in before
    capsys.readouterr()
    assert main(["pack", str(class_folder), str(out), "--overwrite", *QUIET]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shardfeed.json that pack did not write" in err[0]
    assert files_in(out) == before


def test_interrupted_overwrite_still_records_the_earlier_files(
    class_folder: Path, tmp_path: Path
) -> None:
    """Stopped after the earlier pack's manifest went but before its shards did, an
    --overwrite run again removes them: the new plan file names them until they are gone."""
    out = tmp_path / "out"
    pack(class_folder, out, records_per_shard=4)
    (out / "notes.txt").write_text("mine")

    class Stop(Exception):
        pass

    def stop(path: str) -> None:
        raise Stop(path)

    with pytest.raises(Stop):
        pack(class_folder, out, records_per_shard=2, overwrite=True, on_shard=stop)
    pack(class_folder, out, records_per_shard=3, overwrite=True)
    names = set(os.listdir(out))
    assert {n for n in names if n.endswith(".tfrecord")} == {
        f"shard-0000{i}-of-00003.tfrecord" for i in range(3)}
    assert "notes.txt" in names and ".shardfeed-pack.json" not in names
