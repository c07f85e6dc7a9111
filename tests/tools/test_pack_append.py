"""pack --append: a dataset grows by new shards and a manifest version, as a user grows it:
new classes, new days and frames of a day already there, versions that stay readable, an
append stopped anywhere, two appends at once, records that do not match."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import shardfeed
from shardfeed.errors import PackError
from shardfeed.tools.pack import append as packappend
from shardfeed.tools.pack import pack
from shardfeed.tools.pack.csvinput import CsvColumns

SRC = Path(__file__).resolve().parents[2] / "src"
COLUMNS = CsvColumns(labels=("label",), floats="VF", group="day", order="timestamp")
SKY = CsvColumns(labels=("label",), onehot=("sky",), group="day", order="timestamp")


def _photos(root: Path, counts: dict[str, int], seed: int, make_image: Any) -> Path:
    for name, n in counts.items():
        for i in range(n):
            make_image(root / name / f"{name}{seed}-{i}.jpg", seed * 100 + i)
    return root


def _frames(root: Path, name: str, days: dict[str, range], make_image: Any,
            skies: tuple[str, ...] = ("clear", "rain")) -> Path:
    """A CSV of frames: for each day, the frames numbered by its range (a minute apart)."""
    rows = []
    for day, numbers in days.items():
        for j in numbers:
            image = f"img/{day}_{j}.jpg"
            make_image(root / image, hash((day, j)) % 10_000, size=(16, 20))
            rows.append({"path": image, "day": day, "timestamp": f"{day}T12:{j:02d}:00",
                         "label": str(j % 3), "VF": str(j * 0.5),
                         "sky": skies[j % len(skies)]})
    path = root / name
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _filenames(ds: shardfeed.Dataset) -> list[str]:
    return [ds[i]["image/filename"].decode() for i in range(len(ds))]


def test_a_new_class_and_more_images_become_version_2(tmp_path: Path, make_image: Any) -> None:
    first = _photos(tmp_path / "first", {"cat": 3, "dog": 2}, 1, make_image)
    more = _photos(tmp_path / "more", {"cat": 1, "fox": 2}, 2, make_image)
    out = tmp_path / "out"
    pack(first, out, records_per_shard=2)
    before = _files(out)
    result = pack(more, out, append=True, records_per_shard=2)
    assert (result.records, result.shards) == (8, 5)
    after = _files(out)
    assert all(after[name] == kept for name, kept in before.items()
               if name != "shardfeed.json")  # no shard, index or sidecar written again
    with shardfeed.Dataset(str(out)) as ds:
        assert len(ds) == 8 and ds.version == 2
        # the new shards are named beside the first ones (one folder for a read to check)
        assert [s.path for s in ds.manifest.shards][3:] == [
            "v2-shard-00000-of-00002.tfrecord", "v2-shard-00001-of-00002.tfrecord"]
        assert os.path.samefile(out / "v2-shard-00000-of-00002.tfrecord",
                                out / "v2" / "shard-00000-of-00002.tfrecord")
        labels = {n: int(ds[i]["image/class/label"][0]) for i, n in enumerate(_filenames(ds))}
        assert ds.manifest.extra["vocabularies"]["image/class/label"] == ["cat", "dog", "fox"]
    assert {n.split("/")[0]: v for n, v in labels.items()} == {"cat": 0, "dog": 1, "fox": 2}
    with shardfeed.Dataset(str(out), version=1) as old:
        assert len(old) == 5 and old.version == 1
        assert sorted(_filenames(old)) == sorted(str(p.relative_to(first)) for p in
                                                 first.rglob("*.jpg"))
    from shardfeed.dataset.opening import dataset_versions
    from shardfeed.format.manifest import Manifest

    assert dataset_versions(str(out), Manifest.load(out / "shardfeed.json")) == [1, 2]
    with pytest.raises(Exception, match=r"no version 3: it keeps versions 1, 2 .*version=k"):
        shardfeed.Dataset(str(out), version=3)
    # an epoch of version 2 is an exact permutation of all its records
    with shardfeed.Loader(shardfeed.Dataset(str(out)), batch_size=3, seed=1,
                          transform=None) as loader:
        seen = [n.decode() for b in loader for n in b["image/filename"]]
    assert sorted(seen) == sorted(labels)


def test_days_grow_and_windows_continue_across_versions(tmp_path: Path,
                                                        make_image: Any) -> None:
    root = tmp_path / "frames"
    first = _frames(root, "first.csv", {"2024-05-01": range(4), "2024-05-02": range(3)},
                    make_image)
    more = _frames(root, "more.csv", {"2024-05-02": range(3, 6), "2024-05-03": range(4)},
                   make_image)
    out = tmp_path / "days"
    pack(first, out, csv=COLUMNS, records_per_shard=3)
    pack(more, out, csv=COLUMNS, records_per_shard=3, append=True)
    with shardfeed.Dataset(str(out)) as ds:
        assert len(ds) == 14
        names = ds.manifest.extra["group_names"]
        days = [names[int(g)] for g in ds.group_ids]  # type: ignore[index]
        assert days.count("2024-05-02") == 6 and days.count("2024-05-03") == 4
        windows = shardfeed.Windows(ds, length=3)
        with shardfeed.Loader(windows, batch_size=1, shuffle=False, transform=None) as loader:
            found = [[n.decode() for n in window] for b in loader
                     for window in b["image/filename"]]
    # the day packed in two versions is one group: its frames 1, 2 (version 1) and 3
    # (version 2) make a window
    assert ["img/2024-05-02_1.jpg", "img/2024-05-02_2.jpg", "img/2024-05-02_3.jpg"] in found
    assert len(found) == 2 + 4 + 2  # windows of 3 in days of 4, 6 and 4 frames
    with shardfeed.Dataset(str(out), version=1) as old:
        assert len(old) == 7 and len(shardfeed.Windows(old, length=3)) == 3


def test_records_that_do_not_match_are_refused_and_nothing_changes(
        tmp_path: Path, make_image: Any) -> None:
    first = _photos(tmp_path / "first", {"cat": 2}, 1, make_image)
    root = tmp_path / "frames"
    other = _frames(root, "more.csv", {"2024-05-01": range(2)}, make_image)
    out = tmp_path / "out"
    pack(first, out)
    before = (out / "shardfeed.json").read_bytes()
    with pytest.raises(PackError, match=r"do not match the dataset.*group key is 'day'"):
        pack(other, out, csv=COLUMNS, append=True)
    assert (out / "shardfeed.json").read_bytes() == before
    with shardfeed.Dataset(str(out)) as ds:
        assert len(ds) == 2


def test_no_dataset_to_append_to(tmp_path: Path, make_image: Any) -> None:
    more = _photos(tmp_path / "more", {"cat": 1}, 2, make_image)
    with pytest.raises(PackError, match="no dataset to append to.*pack it first"):
        pack(more, tmp_path / "empty", append=True)


def test_an_append_stopped_before_its_commit_leaves_the_version_and_resumes(
        tmp_path: Path, make_image: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _photos(tmp_path / "first", {"cat": 3}, 1, make_image)
    more = _photos(tmp_path / "more", {"cat": 2, "dog": 1}, 2, make_image)
    out = tmp_path / "out"
    pack(first, out, records_per_shard=2)

    def killed(*_: Any, **__: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(packappend, "commit_version", killed)
    with pytest.raises(KeyboardInterrupt):
        pack(more, out, append=True, records_per_shard=2)
    monkeypatch.undo()
    with shardfeed.Dataset(str(out)) as ds:  # version 1, read as before
        assert len(ds) == 3 and ds.version == 1
    with pytest.raises(PackError, match="another append .* is writing version 2.*--resume"):
        pack(more, out, append=True, records_per_shard=2)  # a second append at once
    pack(more, out, append=True, records_per_shard=2, resume=True)
    with shardfeed.Dataset(str(out)) as ds:
        assert len(ds) == 6 and ds.version == 2


def test_a_stop_between_the_version_file_and_the_newest_is_finished_by_resume(
        tmp_path: Path, make_image: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _photos(tmp_path / "first", {"cat": 3}, 1, make_image)
    more = _photos(tmp_path / "more", {"cat": 2}, 2, make_image)
    out = tmp_path / "out"
    pack(first, out)
    real = packappend._fileio.write_bytes_atomic

    def stop_at_the_newest(path: Any, data: bytes) -> None:
        if os.fspath(path) == str(out / "shardfeed.json"):  # the newest, not the new pack's
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(packappend._fileio, "write_bytes_atomic", stop_at_the_newest)
    with pytest.raises(KeyboardInterrupt):
        pack(more, out, append=True)
    monkeypatch.undo()
    assert (out / "shardfeed.v2.json").is_file()
    with shardfeed.Dataset(str(out)) as ds:
        assert len(ds) == 3  # shardfeed.json still names version 1
    with pytest.raises(PackError, match="stopped while it committed version 2.*--resume"):
        pack(more, out, append=True)
    pack(more, out, append=True, resume=True)
    with shardfeed.Dataset(str(out)) as ds:
        assert len(ds) == 5 and ds.version == 2
    assert (out / "shardfeed.json").read_bytes() == (out / "shardfeed.v2.json").read_bytes()


def test_the_loser_of_two_commits_gets_a_clear_error(tmp_path: Path, make_image: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    first = _photos(tmp_path / "first", {"cat": 2}, 1, make_image)
    more = _photos(tmp_path / "more", {"cat": 1}, 2, make_image)
    out = tmp_path / "out"
    pack(first, out)
    real = packappend._fileio.create_bytes

    def other_first(path: Any, data: bytes) -> None:  # another append commits meanwhile
        if str(path).endswith("shardfeed.v2.json"):
            real(path, b"{}")
        real(path, data)

    monkeypatch.setattr(packappend._fileio, "create_bytes", other_first)
    with pytest.raises(PackError, match="another append committed version 2 .* your input was "
                                        "not added"):
        pack(more, out, append=True)
    assert (out / "v2").is_dir() and any((out / "v2").glob("*.tfrecord"))


def test_the_command_line_appends_in_a_fresh_process(tmp_path: Path, make_image: Any) -> None:
    first = _photos(tmp_path / "first", {"cat": 2}, 1, make_image)
    more = _photos(tmp_path / "more", {"owl": 2}, 2, make_image)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(SRC)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shardfeed", *args], capture_output=True,
                              text=True, env=env, timeout=120, check=False)

    assert cli("pack", str(first), str(out)).returncode == 0
    done = cli("pack", str(more), str(out), "--append", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["records"] == 4
    manifest = json.loads((out / "shardfeed.json").read_text())
    assert manifest["extra"]["dataset_version"] == 2
    assert sorted(p.name for p in out.glob("shardfeed.v*.json")) == [
        "shardfeed.v1.json", "shardfeed.v2.json"]
    both = cli("pack", str(more), str(out), "--append", "--overwrite")
    assert both.returncode != 0 and "append and overwrite" in both.stderr


def test_a_dataset_sent_to_another_process_reads_the_version_it_read(
        tmp_path: Path, make_image: Any) -> None:
    import pickle

    first = _photos(tmp_path / "first", {"cat": 2}, 1, make_image)
    more = _photos(tmp_path / "more", {"cat": 3}, 2, make_image)
    out = tmp_path / "out"
    pack(first, out)
    with shardfeed.Dataset(str(out)) as opened:  # a training run's, before the append
        pack(more, out, append=True)  # a new day comes in while it trains
        with pickle.loads(pickle.dumps(opened)) as worker:  # a worker process's copy
            assert len(worker) == 2 and worker.fingerprint == opened.fingerprint
    with shardfeed.Dataset(str(out)) as newest:
        assert len(newest) == 5


def test_overwrite_removes_the_versions_an_append_wrote(tmp_path: Path,
                                                        make_image: Any) -> None:
    first = _photos(tmp_path / "first", {"cat": 2}, 1, make_image)
    more = _photos(tmp_path / "more", {"cat": 1}, 2, make_image)
    out = tmp_path / "out"
    pack(first, out)
    pack(more, out, append=True)
    pack(more, out, append=True)
    (out / "v3" / "notes.txt").write_text("mine")  # a file no pack wrote
    pack(first, out, overwrite=True)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("shard-")) == [
        "shardfeed.json", "v3"]
    assert [p.name for p in (out / "v3").iterdir()] == ["notes.txt"]
    with shardfeed.Dataset(str(out)) as ds:
        assert len(ds) == 2 and ds.version == 1


def test_a_run_goes_on_across_an_append(tmp_path: Path, make_image: Any) -> None:
    from shardfeed.errors import StateError

    first = _photos(tmp_path / "first", {"cat": 4, "dog": 3}, 1, make_image)
    more = _photos(tmp_path / "more", {"cat": 2, "fox": 3}, 2, make_image)
    out = tmp_path / "out"
    pack(first, out, records_per_shard=3)

    def loader(version: int | None = None) -> shardfeed.Loader:
        return shardfeed.Loader(shardfeed.Dataset(str(out), version=version), batch_size=2,
                                seed=5, transform=None)

    def names(batch: dict[str, Any]) -> list[str]:
        return [n.decode() for n in batch["image/filename"]]

    with loader() as run:
        batches = iter(run)
        for _ in range(2):
            next(batches)
        middle = json.loads(json.dumps(run.state()))  # saved mid-epoch 0
        rest_of_epoch = [names(b) for b in batches]
        end = json.loads(json.dumps(run.state()))  # saved at the end of epoch 0
    pack(more, out, append=True, records_per_shard=3)  # a new day comes in
    with loader(version=1) as exact:  # the state restores exactly on its own version
        exact.restore(middle)
        assert [names(b) for b in exact] == rest_of_epoch
    with loader() as newest:
        with pytest.raises(StateError, match=r"saved on version 1 .* version=1"):
            newest.restore(middle)
        with pytest.raises(StateError, match=r"middle of epoch 0 of version 1 .*version=1"):
            newest.restore(middle, to_latest=True)
        newest.restore(end, to_latest=True)  # the next epoch is one of version 2
        moved = [names(b) for b in newest]
    with loader() as fresh:
        fresh.set_epoch(1)
        expected = [names(b) for b in fresh]
    assert moved == expected and len({n for b in moved for n in b}) == 12


def test_frames_of_a_day_that_is_not_the_last_are_refused(tmp_path: Path,
                                                          make_image: Any) -> None:
    root = tmp_path / "frames"
    first = _frames(root, "first.csv", {"2024-05-01": range(3), "2024-05-02": range(3)},
                    make_image)
    late = _frames(root, "late.csv", {"2024-05-01": range(3, 5)}, make_image)
    earlier = _frames(root, "earlier.csv", {"2024-05-02": range(1)}, make_image)
    out = tmp_path / "days"
    pack(first, out, csv=COLUMNS)
    with pytest.raises(PackError, match="group '2024-05-01' would not follow its records"):
        pack(late, out, csv=COLUMNS, append=True)
    assert not (out / "v2").exists()  # a refused append leaves nothing behind
    with pytest.raises(PackError, match="group '2024-05-02' would not follow"):
        pack(earlier, out, csv=COLUMNS, append=True)  # an earlier time
    with shardfeed.Dataset(str(out)) as ds:
        assert ds.version == 1 and len(ds) == 6


def test_category_numbers_that_would_change_are_refused(tmp_path: Path,
                                                        make_image: Any) -> None:
    root = tmp_path / "frames"
    first = _frames(root, "first.csv", {"2024-05-01": range(2)}, make_image,
                    skies=("clear", "rain"))
    other = _frames(root, "other.csv", {"2024-05-02": range(2)}, make_image,
                    skies=("clear", "fog"))
    out = tmp_path / "days"
    pack(first, out, csv=SKY)
    with pytest.raises(PackError, match=r"values of 'image/label/sky' are numbered \['clear', 'fog'\]"):
        pack(other, out, csv=SKY, append=True)


def test_a_commit_whose_answer_was_lost_is_ours(tmp_path: Path, make_image: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    first = _photos(tmp_path / "first", {"cat": 2}, 1, make_image)
    more = _photos(tmp_path / "more", {"cat": 1}, 2, make_image)
    out = tmp_path / "out"
    pack(first, out)
    real = packappend._fileio.create_bytes

    def answer_lost(path: Any, data: bytes) -> None:  # written, then a retry finds it
        real(path, data)
        if str(path).endswith("shardfeed.v2.json"):
            raise FileExistsError(path)

    monkeypatch.setattr(packappend._fileio, "create_bytes", answer_lost)
    pack(more, out, append=True)
    with shardfeed.Dataset(str(out)) as ds:
        assert ds.version == 2 and len(ds) == 3


def test_overwrite_follows_no_link_out_of_the_dataset(tmp_path: Path, make_image: Any) -> None:
    first = _photos(tmp_path / "first", {"cat": 2}, 1, make_image)
    more = _photos(tmp_path / "more", {"cat": 1}, 2, make_image)
    out = tmp_path / "out"
    pack(first, out)
    pack(more, out, append=True)
    elsewhere = tmp_path / "elsewhere"
    (out / "v2").rename(elsewhere)
    (out / "v2").symlink_to(elsewhere)  # a version folder that leads elsewhere
    kept = sorted(p.name for p in elsewhere.iterdir())
    pack(first, out, overwrite=True)
    assert sorted(p.name for p in elsewhere.iterdir()) == kept  # nothing removed through it


ACROSS = """\
import json, sys
import shardfeed
folder, states_file, steps_file = sys.argv[1:4]
states = json.loads(open(states_file).read())
steps = json.loads(open(steps_file).read())
out = {}
for phase, state in states.items():
    first = state["from_step"]
    with shardfeed.Dataset(folder) as newest:  # the version whose records the state read
        version = newest.version_with(state["state"]["source"]["dataset"])
    ds = shardfeed.Dataset(folder, version=version)
    windows = shardfeed.Windows(ds, length=2)
    for step in steps[phase]:
        found = shardfeed.records_at(windows, state["state"], step, state_step=first)
        out[str(step)] = [[s.rank, [r.features["image/filename"] for r in s.records]]
                          for s in found.samples]
print(json.dumps(out))
"""


def test_which_frames_trained_any_step_of_a_run_across_an_append(tmp_path: Path,
                                                                 make_image: Any) -> None:
    """Two ranks train windows of 2 frames; a day is appended after epoch 0 and the run goes
    on with to_latest: a fresh process finds what every step of both epochs held, each
    from the state the run saved in that epoch."""
    root = tmp_path / "frames"
    first = _frames(root, "first.csv", {"2024-05-01": range(12), "2024-05-02": range(12)},
                    make_image)
    more = _frames(root, "more.csv", {"2024-05-02": range(12, 18), "2024-05-03": range(12)},
                   make_image)
    out = tmp_path / "days"
    pack(first, out, csv=COLUMNS, records_per_shard=4)
    options = {"batch_size": 2, "seed": 4, "transform": None, "world_size": 2}

    def loaders() -> list[shardfeed.Loader]:
        return [shardfeed.Loader(shardfeed.Windows(shardfeed.Dataset(str(out)), length=2),
                                 rank=rank, **options) for rank in range(2)]

    def names(batch: dict[str, Any]) -> list[list[str]]:
        return [[n.decode() for n in w] for w in batch["image/filename"]]

    held: list[list[list[list[str]]]] = [[], []]
    before = loaders()
    for rank, loader in enumerate(before):
        held[rank] += [names(b) for b in loader]  # epoch 0 on version 1
    end = json.loads(json.dumps(before[0].state()))
    switch = len(held[0])
    pack(more, out, csv=COLUMNS, records_per_shard=4, append=True)
    after = loaders()
    for rank, loader in enumerate(after):
        loader.restore(end, to_latest=True)
        if rank == 0:
            moved = json.loads(json.dumps(loader.state()))  # epoch 1's start, version 2
        held[rank] += [names(b) for b in loader]
    for loader in before + after:
        loader.close()
    steps = {"v1": list(range(switch)), "v2": list(range(switch, len(held[0])))}  # every step
    states = {"v1": {"state": end, "from_step": None},  # from the run's start
              "v2": {"state": moved, "from_step": switch}}
    (tmp_path / "states.json").write_text(json.dumps(states))
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    (tmp_path / "across.py").write_text(ACROSS)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, str(tmp_path / "across.py"), str(out),
                           str(tmp_path / "states.json"), str(tmp_path / "steps.json")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    for step in steps["v1"] + steps["v2"]:
        for rank in range(2):
            got = [frames for r, frames in found[str(step)] if r == rank]
            assert got == held[rank][step], (step, rank)
    assert any("2024-05-03" in f for step in steps["v2"] for w in held[0][step] for f in w)
