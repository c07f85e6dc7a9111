"""Packing data, not files: every input kind round-trips (pixels, labels, names), and the
partition writer's merge keeps one finished attempt a partition and nothing else."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from shardfeed import Dataset, PackError, pack
from shardfeed.tools.pack.partition import (
    PARTS_FOLDER,
    PartSizes,
    merge_partitions,
    write_partition,
)
from shardfeed.tools.pack.rows import RowFields
from shardfeed.transforms.decode.image import decode_image


def png(pixels: np.ndarray) -> bytes:
    bgr = cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR) if pixels.ndim == 3 else pixels
    return bytes(cv2.imencode(".png", bgr)[1])


def images(n: int, seed: int = 0, shape: tuple[int, ...] = (9, 7, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)


def read_back(folder: Path) -> list[dict[str, Any]]:
    with Dataset(str(folder)) as ds:
        return ds.read_many(range(len(ds)))


def pixels_of(record: dict[str, Any]) -> np.ndarray:
    return decode_image(record["image/encoded"], mode="unchanged", where="test")


def test_arrays_round_trip_as_png_jpeg_and_raw(tmp_path: Path) -> None:
    pixels = images(30)
    labels = np.arange(30) % 4
    pack((pixels, labels), tmp_path / "png", records_per_shard=8)
    records = read_back(tmp_path / "png")
    assert [int(r["label"][0]) for r in records] == labels.tolist()
    assert all(np.array_equal(pixels_of(r), p) for r, p in zip(records, pixels))
    with Dataset(str(tmp_path / "png")) as ds:
        assert ds.manifest.schema.label_key == "label"

    pack((pixels, {"y": labels, "w": labels * 0.5}), tmp_path / "raw",
         fields=RowFields(encode="raw"))
    raw = read_back(tmp_path / "raw")
    assert [np.frombuffer(r["image/raw"], np.uint8).reshape(9, 7, 3).tolist()
            for r in raw] == pixels.tolist()
    assert [float(r["w"][0]) for r in raw] == (labels * 0.5).tolist()

    smooth = np.repeat(np.repeat(pixels[:, :1, :1], 16, 1), 16, 2)  # flat: JPEG keeps it
    pack((smooth, labels), tmp_path / "jpeg", fields=RowFields(encode="jpeg", quality=95))
    jpeg = read_back(tmp_path / "jpeg")
    assert jpeg[0]["image/format"] == b"jpeg"
    assert all(np.abs(pixels_of(r).astype(int) - p).max() <= 3 for r, p in zip(jpeg, smooth))


def test_sixteen_bit_arrays_stay_sixteen_bit(tmp_path: Path) -> None:
    deep = np.random.default_rng(1).integers(0, 65536, (3, 5, 6), dtype=np.uint16)
    pack((deep, np.zeros(3, int)), tmp_path / "d")
    assert all(np.array_equal(pixels_of(r), p) for r, p in zip(read_back(tmp_path / "d"), deep))
    with pytest.raises(PackError, match="uint16 pixels are kept by encode='png' only"):
        pack((deep, np.zeros(3, int)), tmp_path / "e", fields=RowFields(encode="jpeg"))


def test_a_generator_of_dicts_with_names_and_a_path_column(tmp_path: Path) -> None:
    pixels = images(12, seed=2)
    folder = tmp_path / "files"
    folder.mkdir()
    for i in range(0, 12, 2):
        (folder / f"{i}.png").write_bytes(png(pixels[i]))

    def rows() -> Any:
        for i in range(12):
            image: Any = f"{i}.png" if i % 2 == 0 else png(pixels[i])
            yield {"image": image, "label": i, "name": f"img-{i}", "score": [i, i + 1.5]}

    pack(rows(), tmp_path / "out", fields=RowFields(name="name", root=str(folder)))
    records = read_back(tmp_path / "out")
    assert [r["image/filename"] for r in records] == [f"img-{i}".encode() for i in range(12)]
    assert [r["score"].tolist() for r in records] == [[i, i + 1.5] for i in range(12)]
    assert all(np.array_equal(pixels_of(r), p) for r, p in zip(records, pixels))


def test_parquet_files_and_arrow_tables_with_bytes_and_struct_columns(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pixels = images(20, seed=3)
    encoded = [png(p) for p in pixels]
    table = pa.table({"jpeg": [{"bytes": b, "path": None} for b in encoded],
                      "cls": list(range(20)), "id": [f"r{i}" for i in range(20)]})
    pq.write_table(table.slice(0, 10), tmp_path / "a.parquet")
    pq.write_table(table.slice(10), tmp_path / "b.parquet")
    fields = RowFields(image="jpeg", name="id", labels=["cls"])
    pack([tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "pq", fields=fields)
    pack(table, tmp_path / "arrow", fields=fields)
    for out in ("pq", "arrow"):
        records = read_back(tmp_path / out)
        assert [r["image/encoded"] for r in records] == encoded  # stored as they are
        assert [int(r["cls"][0]) for r in records] == list(range(20))
        assert [r["image/filename"] for r in records] == [f"r{i}".encode() for i in range(20)]


def test_webdataset_tars_round_trip_with_keys_labels_and_json(tmp_path: Path) -> None:
    pixels = images(9, seed=4)
    paths = []
    for k in range(2):
        path = tmp_path / f"shard-{k}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(k * 5, min(9, k * 5 + 5)):
                for name, data in ((f"s{i:03d}.png", png(pixels[i])),
                                   (f"s{i:03d}.cls", str(i % 3).encode()),
                                   (f"s{i:03d}.json", json.dumps({"weight": i / 2}).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    pack(paths, tmp_path / "out")
    records = read_back(tmp_path / "out")
    assert [r["image/filename"] for r in records] == [f"s{i:03d}".encode() for i in range(9)]
    assert [int(r["label"][0]) for r in records] == [i % 3 for i in range(9)]
    assert [float(r["json/weight"][0]) for r in records] == [i / 2 for i in range(9)]
    assert all(np.array_equal(pixels_of(r), p) for r, p in zip(records, pixels))


def test_a_hugging_face_dataset_with_an_image_feature(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    pixels = images(8, seed=5)
    encoded = [png(p) for p in pixels]
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["a", "b"])})
    hf = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in encoded], "label": [i % 2 for i in
                                                                          range(8)]},
        features=features)
    pack(hf, tmp_path / "out")
    records = read_back(tmp_path / "out")
    assert [r["image/encoded"] for r in records] == encoded
    assert [int(r["label"][0]) for r in records] == [i % 2 for i in range(8)]


def test_bad_rows_are_named_and_leave_nothing_behind(tmp_path: Path) -> None:
    rows = [{"image": png(images(1)[0]), "label": 0}, {"image": b"not an image", "label": 1}]
    with pytest.raises(PackError, match=r"^the rows, row 1, column 'image': .*no image format"):
        pack(rows, tmp_path / "out")
    assert os.listdir(tmp_path / "out") == []
    with pytest.raises(PackError, match="no image column 'picture'"):
        pack(rows, tmp_path / "out", fields=RowFields(image="picture"))
    pack(rows[:1], tmp_path / "out")
    with pytest.raises(PackError, match="is not empty"):
        pack(rows[:1], tmp_path / "out")
    pack(rows[:1] * 3, tmp_path / "out", overwrite=True)
    assert len(read_back(tmp_path / "out")) == 3


def test_the_merge_keeps_one_finished_attempt_a_partition_and_removes_the_rest(
    tmp_path: Path,
) -> None:
    """Retries and speculative copies of a task write beside each other; what did not finish
    (a killed attempt's temporary shard) and what is not kept leave no trace."""
    out = tmp_path / "out"
    pixels = images(40, seed=6)
    rows = [{"image": png(p), "label": i} for i, p in enumerate(pixels)]
    sizes = PartSizes(records=7)
    parts = [write_partition(rows[p * 10:(p + 1) * 10], out, partition=p, sizes=sizes,
                             attempt="b") for p in range(4)]
    again = write_partition(rows[10:20], out, partition=1, sizes=sizes, attempt="a")
    killed = out / PARTS_FOLDER / "000002-c"
    killed.mkdir()
    (killed / "part-00000.tfrecord.tmp").write_bytes(b"half a shard")
    with pytest.raises(PackError, match=r"partition\(s\) \[3\] of 4 have no finished part"):
        merge_partitions(out, [parts[0], parts[1], parts[2]], partitions=4)
    merge_partitions(out, [parts[2], again.to_json(), parts[3], parts[1], parts[0]],
                     partitions=4, verify=True)
    assert sorted(os.listdir(out)) == sorted(
        [f"shard-{n:05d}-of-00008{s}" for n in range(8) for s in (".tfrecord", ".tfrecord.idx",
                                                                   ".tfrecord.idx.npy")]
        + ["shardfeed.json"])
    assert [int(r["label"][0]) for r in read_back(out)] == list(range(40))


def test_the_merge_refuses_a_part_changed_after_its_task(tmp_path: Path) -> None:
    out = tmp_path / "out"
    part = write_partition([{"image": png(images(1)[0]), "label": 0}], out, partition=0)
    with open(out / part.shards[0].path, "ab") as f:
        f.write(b"x")
    with pytest.raises(PackError, match="holds .* bytes, its partial says"):
        merge_partitions(out, [part])


def test_the_command_packs_parquet_columns_it_is_told(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from shardfeed.cli.main import main

    encoded = [png(p) for p in images(6, seed=7)]
    pq.write_table(pa.table({"jpeg": encoded, "y": list(range(6)), "extra": [0.5] * 6,
                             "id": [f"i{i}" for i in range(6)]}), tmp_path / "x.parquet")
    assert main(["pack", str(tmp_path / "x.parquet"), str(tmp_path / "out"), "--image-column",
                 "jpeg", "--label-columns", "y", "--name-column", "id"]) == 0
    records = read_back(tmp_path / "out")
    assert [r["image/encoded"] for r in records] == encoded
    assert [int(r["y"][0]) for r in records] == list(range(6))
    assert "extra" not in records[0]  # only the label columns named


def test_a_row_whose_image_claims_30000_by_30000_pixels_is_refused_by_name(
    tmp_path: Path,
) -> None:
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)
    bomb = (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr
            + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)))
    rows = [{"image": png(images(1)[0]), "label": 0}, {"image": bomb, "label": 1}]
    with pytest.raises(PackError, match=r"\(the rows, row 1, column 'image'\).*30000"):
        pack(rows, tmp_path / "out")
    assert os.listdir(tmp_path / "out") == []


def test_npz_archives_from_the_command_as_keras_saves_mnist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from shardfeed.cli.main import main

    train, test = images(12, seed=3, shape=(6, 6)), images(5, seed=4, shape=(6, 6))
    np.savez(tmp_path / "mnist.npz", x_train=train, y_train=np.arange(12) % 10,
             x_test=test, y_test=np.arange(5))
    out = str(tmp_path / "out")
    assert main(["pack", str(tmp_path / "mnist.npz"), out, "--image-column", "x_train",
                 "--label-columns", "y_train", "--no-progress"]) == 0
    records = read_back(tmp_path / "out")
    assert [int(r["y_train"][0]) for r in records] == (np.arange(12) % 10).tolist()
    assert all(np.array_equal(pixels_of(r), p) for r, p in zip(records, train))
    # the test split, not named: arrays of other lengths are not guessed at
    assert main(["pack", str(tmp_path / "mnist.npz"), str(tmp_path / "guess"),
                 "--image-column", "x_test", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "'x_test' has 5 rows, 'x_train' 12" in err and "--label-columns" in err
    assert os.listdir(tmp_path / "guess") == []
    assert main(["pack", str(tmp_path / "mnist.npz"), str(tmp_path / "none"),
                 "--no-progress"]) == 1
    assert "no array 'image'" in capsys.readouterr().err
    np.savez(tmp_path / "objects.npz", image=train, label=np.array([{"a": 1}] * 12))
    with pytest.raises(PackError, match="Python objects.*no pickles"):
        pack(str(tmp_path / "objects.npz"), tmp_path / "objects")
