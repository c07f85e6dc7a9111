"""``on_error="skip"`` skips every record that cannot become a sample, whatever is wrong with
it: a referenced path that is not UTF-8 or holds a NUL byte, a raw image whose stored height
is bytes, several values or a float, an image feature of the wrong kind, a decode that runs
out of memory. With ``on_error="raise"`` each is a DecodeError naming the shard, record and
byte offset; a bug in a user's transform still propagates as itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from image_bombs import jpeg_bomb, peak_rss_mb

from shardfeed.dataset import Dataset
from shardfeed.errors import DecodeError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.transforms import CenterCrop, Compose, DecodeImage, presets

N = 24
BAD = 20  # after the records Dataset samples to infer the schema


def _pixels(i: int) -> np.ndarray:
    return np.full((24, 32, 3), (i * 9) % 250, np.uint8)


def _referenced(folder: Path, bad_path: bytes) -> Dataset:
    images = folder / "images"
    images.mkdir(parents=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(N):
            name = f"{i}.jpg"
            (images / name).write_bytes(bytes(simplejpeg.encode_jpeg(_pixels(i))))
            writer.write_example({"image/path": bad_path if i == BAD else name.encode(),
                                  "index": [i]})
    return Dataset(str(folder / "part-0.tfrecord"), root=str(images))


def _raw(folder: Path, bad_height: Any) -> Dataset:
    folder.mkdir(parents=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(N):
            writer.write_example({
                "image/raw": _pixels(i).tobytes(),
                "image/height": bad_height if i == BAD else [24],
                "image/width": [32], "image/channels": [3], "index": [i],
            })
    return Dataset(str(folder / "part-0.tfrecord"))


def _embedded(folder: Path, bad_image: Any) -> Dataset:
    folder.mkdir(parents=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(N):
            image = bytes(simplejpeg.encode_jpeg(_pixels(i)))
            writer.write_example({"image/encoded": bad_image if i == BAD else image,
                                  "index": [i]})
    return Dataset(str(folder / "part-0.tfrecord"))


CASES = {
    "path not UTF-8": (lambda f: _referenced(f, b"caf\xe9.jpg"), "not UTF-8 text"),
    "path with NUL": (lambda f: _referenced(f, b"20.jpg\x00.png"), "holds a NUL byte"),
    "raw height as bytes": (lambda f: _raw(f, b"24"),
                            "'image/height' must hold one positive int, it holds bytes"),
    "raw height of two values": (lambda f: _raw(f, [24, 24]),
                                 r"'image/height' must hold one positive int, it holds int64 "
                                 + r"values of shape \(2,\)"),
    "raw height as a float": (lambda f: _raw(f, np.array([24.0], np.float32)),
                              "'image/height' must hold one positive int, it holds float32"),
    "image of ints": (lambda f: _embedded(f, [1, 2, 3]), "expected one bytes value, got int64"),
    "two images in one feature": (lambda f: _embedded(
        f, [bytes(simplejpeg.encode_jpeg(_pixels(0))),
            bytes(simplejpeg.encode_jpeg(np.zeros((8, 8, 3), np.uint8)))]),
        "different shapes"),
}


def ids_of(loader: Loader) -> list[int]:
    return [int(i) for batch in loader for i in np.asarray(batch["index"]).reshape(-1)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("transform", ["train", "decode"])
def test_raise_names_the_record(tmp_path: Path, case: str, transform: str) -> None:
    build, reason = CASES[case]
    ds = build(tmp_path / "ds")
    path, record, offset = ds.locate(BAD)
    op: Any = presets.train(size=16) if transform == "train" else Compose(
        [DecodeImage(), CenterCrop(8)])
    with pytest.raises(DecodeError, match=reason) as caught:
        list(Loader(ds, batch_size=4, shuffle=False, transform=op, num_threads=2))
    assert (caught.value.path, caught.value.record, caught.value.offset) == (path, record, offset)
    assert f"record {record} at byte {offset}" in str(caught.value)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("transform", ["train", "decode"])
def test_skip_replaces_and_counts(tmp_path: Path, case: str, transform: str) -> None:
    ds = CASES[case][0](tmp_path / "ds")
    op: Any = presets.train(size=16) if transform == "train" else Compose(
        [DecodeImage(), CenterCrop(8)])
    loader = Loader(ds, batch_size=4, seed=5, on_error="skip", transform=op, num_threads=2)
    ids = ids_of(loader)
    assert len(ids) == N and BAD not in ids
    assert loader.stats().skipped_total == 1
    # the replacement is keyed: the same with one thread
    assert ids_of(Loader(ds, batch_size=4, seed=5, on_error="skip", transform=op,
                         num_threads=1)) == ids


def _big_last(folder: Path) -> Path:
    """Small JPEGs, and record ``BAD`` an 8000×8000 JPEG: allowed (64 MP), 192 MB decoded."""
    folder.mkdir(parents=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(N):
            image = jpeg_bomb(8000, 8000) if i == BAD else bytes(simplejpeg.encode_jpeg(_pixels(i)))
            writer.write_example({"image/encoded": image, "index": [i]})
    return folder


RUN_OUT_OF_MEMORY = """
    import resource
    from shardfeed.dataset import Dataset
    from shardfeed.errors import DecodeError
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import CenterCrop, Compose, DecodeImage

    def vm_size():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize"):
                return int(line.split()[1]) * 1024

    loader = Loader(Dataset(ARGS["folder"]), batch_size=4, shuffle=False,
                    on_error=ARGS["on_error"], transform=Compose([DecodeImage(), CenterCrop(8)]),
                    num_threads=1)
    batches = iter(loader)
    ids = list(next(batches)["index"])  # the thread is started; now memory runs short
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (64 << 20), resource.RLIM_INFINITY))
    try:
        for batch in batches:
            ids.extend(batch["index"])
        RESULT["ids"] = [int(i) for i in ids]
        RESULT["skipped"] = loader.stats().skipped_total
    except DecodeError as exc:
        RESULT["error"] = [type(exc).__name__, str(exc), exc.record]
"""


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_decode_that_runs_out_of_memory_is_a_bad_record(tmp_path: Path, on_error: str) -> None:
    folder = _big_last(tmp_path / "ds")
    _, result = peak_rss_mb(RUN_OUT_OF_MEMORY, folder=str(folder), on_error=on_error)
    if on_error == "raise":
        kind, text, record = result["error"]
        assert kind == "DecodeError" and record == BAD
        assert "out of memory while decoding a 8000×8000 JPEG" in text
        assert f"record {BAD}" in text
    else:
        assert BAD not in result["ids"] and len(result["ids"]) == N
        assert result["skipped"] == 1


def test_a_bug_in_a_user_transform_still_propagates(tmp_path: Path) -> None:
    ds = _raw(tmp_path / "ds", [24])

    def buggy(sample: dict[str, Any]) -> dict[str, Any]:
        if int(sample["index"][0]) == 7:
            return {"index": sample["index"]} | {"oops": 1 / 0}
        return sample

    loader = Loader(ds, batch_size=4, shuffle=False, on_error="skip", transform=buggy)
    with pytest.raises(ZeroDivisionError) as caught:
        list(loader)
    assert "record id 7" in "\n".join(getattr(caught.value, "__notes__", []))
