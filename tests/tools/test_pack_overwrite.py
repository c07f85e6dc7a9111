"""pack --overwrite removes what an earlier pack wrote and nothing else; it never writes over
a file it did not write."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardfeed import Dataset
from shardfeed.cli.main import main
from shardfeed.errors import FormatError, PackError
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


# A pack of data (rows, Parquet) goes through parts and a merge, as pack_ray does: killed
# mid-merge, a rerun of the same pack removes what the merge left and finishes.

_KILLED_ROWS_PACK = r"""
import os, signal, sys
from shardfeed.tools.pack import pack, output, partition

phase, source, out = sys.argv[1:]

def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # as a crash does: no clean-up

if phase == "mid-merge":  # two shards renamed to their final names, the rest in _parts/
    rename, moved = partition._move_shard, []

    def move_then_die(src, dst):
        rename(src, dst)
        moved.append(dst)
        if len(moved) == 2:
            die()

    partition._move_shard = move_then_die
elif phase == "writing":  # one part written, the merge not begun
    write, written = partition.write_shard, []

    def write_then_die(path, payloads):
        if written:
            die()
        written.append(path)
        return write(path, payloads)

    partition.write_shard = write_then_die
elif phase == "after-manifest":  # committed, the parts folder not yet removed
    remove = partition.remove_parts

    def die_once_committed(folder):
        if os.path.exists(os.path.join(folder, "shardfeed.json")):
            die()
        remove(folder)

    partition.remove_parts = die_once_committed
pack(source, out, records_per_shard=4)
"""


def _rows_file(tmp_path: Path) -> Path:
    import cv2
    import numpy as np

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(11)
    images = [bytes(cv2.imencode(".png", rng.integers(0, 256, (4, 6, 3), np.uint8))[1])
              for _ in range(18)]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"image": images, "label": list(range(18))}), path)
    return path


def _killed_rows_pack(phase: str, source: Path, out: Path) -> None:
    import signal
    import subprocess
    import sys

    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _KILLED_ROWS_PACK, phase, str(source),
                           str(out)], env=env, capture_output=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]


def _payloads(folder: Path) -> tuple[list[bytes], str]:
    with Dataset(str(folder)) as ds:
        return ds.read_payloads(range(len(ds))), ds.fingerprint


def test_a_pack_of_rows_killed_mid_merge_is_refused_then_finished_by_a_rerun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _rows_file(tmp_path)
    pack(source, tmp_path / "one", records_per_shard=4)
    out = tmp_path / "out"
    _killed_rows_pack("mid-merge", source, out)
    assert len(list(out.glob("shard-*-of-00005.tfrecord"))) == 2
    assert (out / "_parts").is_dir() and not (out / "shardfeed.json").exists()
    for argv in (["verify", str(out), "--no-progress"], ["inspect", str(out)]):
        capsys.readouterr()
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"'{out}'" in err[0] and "_parts/" in err[0], err
        assert "run the same pack again" in err[0]

    pack(source, out, records_per_shard=4)  # the same call again
    assert _payloads(out) == _payloads(tmp_path / "one")
    assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "one"))  # no _parts/


def test_overwrite_replaces_a_pack_of_rows_killed_mid_merge(tmp_path: Path) -> None:
    source = _rows_file(tmp_path)
    pack(source, tmp_path / "one", records_per_shard=3)
    out = tmp_path / "out"
    _killed_rows_pack("mid-merge", source, out)
    pack(source, out, records_per_shard=3, overwrite=True)  # other options, overwrite
    assert _payloads(out) == _payloads(tmp_path / "one")
    assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "one"))


def test_a_pack_killed_after_its_manifest_is_whole_and_its_parts_go_with_the_next_pack(
    tmp_path: Path,
) -> None:
    source = _rows_file(tmp_path)
    pack(source, tmp_path / "one", records_per_shard=4)
    out = tmp_path / "out"
    _killed_rows_pack("after-manifest", source, out)
    assert (out / "_parts").is_dir()
    assert _payloads(out) == _payloads(tmp_path / "one")  # the manifest is the commit point
    with pytest.raises(PackError, match="not empty.*overwrite=True"):
        pack(source, out, records_per_shard=4)
    assert _payloads(out) == _payloads(tmp_path / "one")  # refused: the dataset stays
    pack(source, out, records_per_shard=4, overwrite=True)
    assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "one"))


def test_what_a_killed_merge_left_is_removed_only_when_nothing_else_is_there(
    tmp_path: Path,
) -> None:
    source = _rows_file(tmp_path)
    out = tmp_path / "out"
    _killed_rows_pack("mid-merge", source, out)
    (out / "notes.txt").write_text("mine")
    before = files_in(out)
    with pytest.raises(PackError, match=r"merge did not finish.*merge\.json.*'notes\.txt'"):
        pack(source, out, records_per_shard=4)
    assert files_in(out) == before and (out / "_parts").is_dir()  # nothing removed

    # a journal that names a file the merge does not write is not followed
    (out / "notes.txt").unlink()
    journal = out / "_parts" / "merge.json"
    for names in (["notes.txt"], ["../one/shard-00000-of-00005.tfrecord"]):
        (out / "notes.txt").write_text("mine")
        journal.write_text(json.dumps({"shardfeed_merge": 1, "files": names}))
        with pytest.raises(PackError, match=r"cannot read the merge journal '.*merge\.json'"):
            pack(source, out, records_per_shard=4, overwrite=True)
        assert (out / "notes.txt").read_text() == "mine"
        (out / "notes.txt").unlink()


def test_a_pack_of_rows_killed_before_its_merge_is_refused_not_offered_a_glob(
    tmp_path: Path,
) -> None:
    source = _rows_file(tmp_path)
    out = tmp_path / "out"
    _killed_rows_pack("writing", source, out)
    assert os.listdir(out) == ["_parts"]
    with pytest.raises(FormatError) as refused:
        Dataset(out)
    message = str(refused.value)
    assert f"'{out}'" in message and "_parts/" in message and "glob" not in message
    assert "run the same pack again" in message
    pack(source, out, records_per_shard=4)
    assert len(Dataset(out)) == 18 and "_parts" not in os.listdir(out)
