"""A Hugging Face ``save_to_disk`` folder is packed from the files inside it, whatever its
``state.json`` names.

The layout is a user's machine with a downloaded folder beside datasets of their own::

    tmp/
      hf/             the download: state.json, dataset_info.json, data-00000-of-00001.arrow
      hf-private/     the user's: data.arrow (8 records), a name that starts like hf's
      secret.arrow    the user's: the same 8 records

``datasets.load_from_disk`` reads whatever ``state.json`` names; pack must not (8 records of
``secret.arrow`` were packed). Each test edits the download as an attacker would and packs it
as the user does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from shardfeed import Dataset, PackError, pack
from shardfeed.errors import UnsafePathError

datasets = pytest.importorskip("datasets")

BIN = Path(sys.executable).parent
DATA = "data-00000-of-00001.arrow"
SECRET_LABELS = list(range(100, 108))


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    return bytes(cv2.imencode(".png", pixels)[1])


def _saved(folder: Path, labels: list[int], **save: Any) -> None:
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    hf = datasets.Dataset.from_dict(
        {"image": [{"bytes": png(i), "path": None} for i in labels], "label": labels},
        features=features)
    hf.save_to_disk(str(folder), **save)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """hf/ (3 records: labels 0, 1, 2), hf-private/data.arrow and secret.arrow (8 each)."""
    _saved(tmp_path / "hf", [0, 1, 2])
    _saved(tmp_path / "mine", SECRET_LABELS)
    (tmp_path / "hf-private").mkdir()
    os.rename(tmp_path / "mine" / DATA, tmp_path / "hf-private" / "data.arrow")
    (tmp_path / "secret.arrow").write_bytes((tmp_path / "hf-private" / "data.arrow").read_bytes())
    return tmp_path


def _name_data_files(folder: Path, *names: str) -> None:
    state_path = folder / "state.json"
    state = json.loads(state_path.read_text())
    state["_data_files"] = [{"filename": n} for n in names]
    state_path.write_text(json.dumps(state))


def _labels(folder: Path) -> list[int]:
    with Dataset(str(folder)) as ds:
        return [int(r["label"][0]) for r in ds.read_many(range(len(ds)))]


def _refused(home: Path, reason: str) -> str:
    out = home / "out"
    with pytest.raises(UnsafePathError) as caught:
        pack(home / "hf", out)
    assert isinstance(caught.value, PackError)
    text = str(caught.value)
    assert reason in text and "save_to_disk" in text
    assert not out.exists() or os.listdir(out) == []
    return text


def test_the_command_refuses_a_state_json_naming_a_file_outside_in_a_fresh_process(
    home: Path,
) -> None:
    """The user's steps: ``shardfeed pack hf out`` on a download whose state.json names
    ``../secret.arrow``. One line names the file, the entry, the path and what to do."""
    _name_data_files(home / "hf", "../secret.arrow")
    done = subprocess.run([str(BIN / "shardfeed"), "pack", "hf", "out", "--no-progress"],
                          cwd=home, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stderr
    err = done.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert ("'hf/state.json' (_data_files[0]) names the data file '../secret.arrow', which "
            "leads out of 'hf'") in err
    assert "download it again or save it again with save_to_disk" in err
    assert "pack(datasets.load_from_disk(folder), ...)" in err
    assert not (home / "out").exists() or os.listdir(home / "out") == []


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "sibling", "sibling-absolute",
                                  "dotdot-inside", "file-url"])
def test_a_data_file_outside_the_folder_is_refused(home: Path, kind: str) -> None:
    named = {
        "dotdot": "../secret.arrow",
        "absolute": str(home / "secret.arrow"),
        "sibling": "../hf-private/data.arrow",  # starts like 'hf': outside all the same
        "sibling-absolute": str(home / "hf-private" / "data.arrow"),
        "dotdot-inside": "sub/../../hf-private/data.arrow",
        "file-url": f"file://{home / 'secret.arrow'}",
    }[kind]
    (home / "hf" / "sub").mkdir()
    _name_data_files(home / "hf", DATA, named)
    text = _refused(home, "leads out of")
    assert f"'{home / 'hf' / 'state.json'}' (_data_files[1])" in text and named in text


def test_a_url_is_refused_before_any_request(home: Path) -> None:
    _name_data_files(home / "hf", "http://127.0.0.1:9/data.arrow")
    _refused(home, "is a URL (http://)")


@pytest.mark.parametrize("target", ["hf-private/data.arrow", "secret.arrow"])
def test_a_data_file_that_is_a_link_out_is_refused(home: Path, target: str) -> None:
    (home / "hf" / DATA).unlink()
    (home / "hf" / DATA).symlink_to(home / target)
    text = _refused(home, "through a symbolic link")
    assert f"(to '{home / target}')" in text


@pytest.mark.parametrize("name", ["state.json", "dataset_info.json"])
def test_a_json_file_that_is_a_link_out_is_refused(home: Path, name: str) -> None:
    """state.json linked to another dataset's (naming its data file by the same name, under a
    folder the link leads to); dataset_info.json linked to the user's (class names)."""
    _saved(home / "hf-private" / "other", [5])
    (home / "hf" / name).unlink()
    (home / "hf" / name).symlink_to(home / "hf-private" / "other" / name)
    _refused(home, "through a symbolic link")


def test_names_that_stay_inside_are_read(home: Path) -> None:
    """``sub/../x``, an absolute path inside and a link to a file inside are all the
    folder's own files."""
    folder = home / "hf"
    (folder / "blobs").mkdir()
    os.rename(folder / DATA, folder / "blobs" / "x.arrow")
    (folder / DATA).symlink_to(folder / "blobs" / "x.arrow")
    for names in (["sub/../" + DATA], [str(folder / "blobs" / "x.arrow")], [DATA]):
        _name_data_files(folder, *names)
        pack(folder, home / "out", overwrite=True)
        assert _labels(home / "out") == [0, 1, 2]


def test_a_folder_reached_through_a_link_is_read_and_still_confined(home: Path) -> None:
    """The user names a link to the folder (``ln -s /mnt/disk/hf current``): its files are
    read; a data file linked to the real folder's sibling is not."""
    store = home / "store"
    store.mkdir()
    os.rename(home / "hf", store / "hf")
    os.rename(home / "hf-private", store / "hf-private")
    (home / "current").symlink_to(store / "hf")
    pack(home / "current", home / "out")
    assert _labels(home / "out") == [0, 1, 2]

    (store / "hf" / DATA).unlink()
    (store / "hf" / DATA).symlink_to(store / "hf-private" / "data.arrow")
    with pytest.raises(UnsafePathError, match="through a symbolic link"):
        pack(home / "current", home / "out2")
    _name_data_files(store / "hf", "../hf-private/data.arrow")
    with pytest.raises(UnsafePathError, match="leads out of"):
        pack(home / "current", home / "out2")


def test_files_in_state_json_order_are_packed_as_load_from_disk_reads_them(
    tmp_path: Path,
) -> None:
    """Several data files, and a saved format: the rows are those load_from_disk gives, in
    its order, as Python values."""
    _saved(tmp_path / "hf", list(range(7)), num_shards=3)
    pack(tmp_path / "hf", tmp_path / "out")
    assert _labels(tmp_path / "out") == list(range(7))
    loaded = datasets.load_from_disk(str(tmp_path / "hf"))
    loaded.set_format("numpy")
    loaded.save_to_disk(str(tmp_path / "np"))
    pack(tmp_path / "np", tmp_path / "out-np")
    with Dataset(str(tmp_path / "out")) as a, Dataset(str(tmp_path / "out-np")) as b:
        assert a.read_many(range(7)) == b.read_many(range(7))


def test_a_damaged_folder_is_a_pack_error_naming_the_file(home: Path) -> None:
    folder = home / "hf"
    state = (folder / "state.json").read_text()
    for text, match in (("{not json", "is not JSON"),
                        ('{"_data_files": []}', r"lists no data files \(_data_files\)"),
                        ('{"_data_files": [{"name": "x"}]}', r"_data_files\[0\] is not")):
        (folder / "state.json").write_text(text)
        with pytest.raises(PackError, match=f"'{folder / 'state.json'}'.*{match}"):
            pack(folder, home / "out")
    (folder / "state.json").write_text(state)

    os.truncate(folder / "dataset_info.json", (16 << 20) + 1)  # checked before it is read
    with pytest.raises(PackError, match=r"dataset_info.json' is 16777217 bytes, over the 16 MiB"):
        pack(folder, home / "out")
    _saved(home / "again", [0])
    os.replace(home / "again" / "dataset_info.json", folder / "dataset_info.json")

    (folder / DATA).write_bytes(b"\x00" * 64)
    with pytest.raises(PackError, match=f"cannot read the data file '{folder / DATA}'"):
        pack(folder, home / "out")
    (folder / DATA).unlink()
    os.mkfifo(folder / DATA)  # never waited on
    with pytest.raises(PackError, match="is not a regular file"):
        pack(folder, home / "out")
    (folder / "state.json").unlink()
    (folder / "state.json").symlink_to(".")  # inside, but a folder
    with pytest.raises(PackError, match=r"state.json' is not a regular file"):
        pack(folder, home / "out")
