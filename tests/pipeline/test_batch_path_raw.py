"""Raw fixed-shape records (``pack --mode raw``, e.g. MNIST digits as 28x28x1 uint8) go through
the batch path: a slice's pixels are copied into the batch rows at once, giving the very
batches of the sample-by-sample path on 1, 2 and 4 threads; a record that does not fit is
still named or skipped exactly as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from pipeline_helpers import assert_same_batches, collect, record_ids

from shardfeed.dataset import Dataset
from shardfeed.errors import DecodeError, SchemaError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.tools.pack import pack
from shardfeed.transforms import Compose, DecodeImage

_CHANNELS = {"gray": 1, "rgb": 3, "rgba": 4}


def _pixels(i: int, kind: str, size: tuple[int, int] = (28, 28)) -> np.ndarray:
    rng = np.random.default_rng(i)
    return rng.integers(0, 256, (*size, _CHANNELS[kind]), dtype=np.uint8)


def _write(folder: Path, kind: str | list[str], n: int = 70, *, defect: dict[int, str] | None = None,
           channels_column: bool = True) -> Dataset:
    """``n`` records as ``pack --mode raw`` writes them (``image/raw`` uint8 bytes with
    ``image/height``, ``image/width``, ``image/channels``); ``kind`` may vary by record;
    ``defect`` gives some records a wrong height, short bytes or another size."""
    folder.mkdir(parents=True, exist_ok=True)
    defect = defect or {}
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(n):
            this = kind if isinstance(kind, str) else kind[i % len(kind)]
            size = (27, 28) if defect.get(i) == "other-size" else (28, 28)
            pixels = _pixels(i, this, size)
            raw = pixels.tobytes()
            height = pixels.shape[0]
            if defect.get(i) == "short":
                raw = raw[:-5]
            if defect.get(i) == "height":
                height = 27
            features: dict[str, Any] = {
                "image/raw": raw, "image/height": [height], "image/width": [pixels.shape[1]],
                "image/class/label": [i % 10], "index": [i], "image/filename": f"{i}.png".encode(),
            }
            if channels_column:
                features["image/channels"] = [pixels.shape[2]]
            writer.write_example(features)
    return Dataset(str(folder))




def _pair(ds: Dataset, channels: str, *, keep_encoded: bool = False,
          **options: Any) -> tuple[list[Any], list[Any]]:
    """Batches of the batch path and of the sample path (Compose has no batch form)."""
    options.setdefault("batch_size", 16)
    op = DecodeImage(channels=channels, keep_encoded=keep_encoded)  # type: ignore[arg-type]
    fast = collect(Loader(ds, transform=op, **options))
    slow = collect(Loader(ds, transform=Compose([op]), **options))
    return fast, slow


def _no_sample_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardfeed.pipeline.produce import SliceBuilder

    def refuse(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("a slice went sample by sample")

    monkeypatch.setattr(SliceBuilder, "build_samples", refuse)


@pytest.mark.parametrize("kind", ["gray", "rgb", "rgba", "mixed"])
@pytest.mark.parametrize("channels", ["gray", "rgb"])
def test_raw_batches_are_the_sample_paths_batches(tmp_path: Path, kind: str,
                                                  channels: str) -> None:
    stored: str | list[str] = ["gray", "rgb", "rgba"] if kind == "mixed" else kind
    ds = _write(tmp_path / kind, stored)
    fast, slow = _pair(ds, channels, num_threads=2)
    assert_same_batches(fast, slow)
    assert sorted(record_ids(fast)) == list(range(70))
    assert fast[0]["image"].shape == (16, 28, 28, 1 if channels == "gray" else 3)
    assert "image/raw" not in fast[0] and "image/height" in fast[0]
    # the pixels are the stored ones (a grey digit repeated to RGB)
    row, index = 0, int(fast[0]["index"][0])
    expected = _pixels(index, stored if isinstance(stored, str) else stored[index % 3])
    if channels == "gray" and kind == "gray":
        np.testing.assert_array_equal(fast[0]["image"][row], expected)
    if channels == "rgb" and kind in ("gray", "rgb", "rgba"):
        want = np.repeat(expected, 3, axis=-1) if kind == "gray" else expected[..., :3]
        np.testing.assert_array_equal(fast[0]["image"][row], want)
    if channels == "gray" and kind == "rgb":
        gray = cv2.cvtColor(expected, cv2.COLOR_RGB2GRAY)[..., None]
        np.testing.assert_array_equal(fast[0]["image"][row], gray)


def test_raw_records_without_a_channels_feature(tmp_path: Path) -> None:
    ds = _write(tmp_path / "g", "gray", channels_column=False)
    fast, slow = _pair(ds, "gray")
    assert_same_batches(fast, slow)
    assert sorted(record_ids(fast)) == list(range(70))


def test_keep_encoded_keeps_the_raw_bytes(tmp_path: Path) -> None:
    ds = _write(tmp_path / "g", "gray")
    fast, slow = _pair(ds, "gray", keep_encoded=True)
    assert_same_batches(fast, slow)
    assert "image/raw" in fast[0]


@pytest.mark.parametrize("kind", ["gray", "rgb"])
def test_same_bytes_on_1_2_4_threads(tmp_path: Path, kind: str) -> None:
    ds = _write(tmp_path / kind, kind)
    runs = [collect(Loader(ds, batch_size=16, seed=3, transform=DecodeImage(channels="rgb"),
                            num_threads=t)) for t in (1, 2, 4)]
    assert_same_batches(runs[0], runs[1])
    assert_same_batches(runs[0], runs[2])


@pytest.mark.parametrize("defect", ["height", "short"])
def test_a_raw_record_that_does_not_fit_is_named_and_skipped(tmp_path: Path,
                                                             defect: str) -> None:
    ds = _write(tmp_path / defect, "gray", defect={33: defect})
    with pytest.raises(DecodeError, match=r"record 33 at byte \d+"):
        collect(Loader(ds, batch_size=16, transform=DecodeImage(channels="gray")))
    fast, slow = _pair(ds, "gray", on_error="skip", num_threads=2)
    assert_same_batches(fast, slow)
    ids = record_ids(fast)
    assert 33 not in ids and len(ids) == 70


def test_a_raw_image_of_another_size_is_named(tmp_path: Path) -> None:
    ds = _write(tmp_path / "size", "gray", defect={40: "other-size"})
    with pytest.raises(SchemaError, match=r"record 40 at byte \d+|epoch position"):
        collect(Loader(ds, batch_size=16, transform=DecodeImage(channels="gray")))


@pytest.mark.parametrize("kind", ["gray", "rgb", "rgba", "mixed"])
@pytest.mark.parametrize("channels", ["gray", "rgb"])
def test_raw_records_take_the_batch_path(tmp_path: Path, kind: str, channels: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ds = _write(tmp_path / kind, ["gray", "rgb"] if kind == "mixed" else kind)
    _no_sample_path(monkeypatch)
    batches = collect(Loader(ds, batch_size=16, transform=DecodeImage(channels=channels),  # type: ignore[arg-type]
                              num_threads=2))
    assert sorted(record_ids(batches)) == list(range(70))


def test_a_folder_packed_raw_goes_through_the_batch_path(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user does: ``pack(mode="raw")`` a folder of small grey digits, then load."""
    for i in range(40):
        folder = tmp_path / "digits" / str(i % 4)
        folder.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(folder / f"{i:03d}.png"), _pixels(i, "gray")[..., 0])
    pack(str(tmp_path / "digits"), str(tmp_path / "packed"), mode="raw")
    ds = Dataset(str(tmp_path / "packed"))
    fast, slow = _pair(ds, "gray", batch_size=8, seed=5)
    assert_same_batches(fast, slow)
    images = sorted(bytes(image) for batch in fast for image in batch["image"])
    assert images == sorted(_pixels(i, "gray").tobytes() for i in range(40))
    _no_sample_path(monkeypatch)
    again = collect(Loader(ds, batch_size=8, seed=5, transform=DecodeImage(channels="gray")))
    assert_same_batches(again, fast)


@pytest.mark.parametrize("kind", ["gray", "rgb"])
def test_stored_pixels_are_read_straight_into_the_batch(tmp_path: Path, kind: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stored bytes that are the rows' bytes are copied once, as the records are read (no
    bytes object a record, no second copy), and are the stored pixels."""
    from shardfeed.transforms.decode import raw_rows

    def copied_again(*args: Any) -> None:
        raise AssertionError("the pixels were copied a second time")

    ds = _write(tmp_path / kind, kind)
    monkeypatch.setattr(raw_rows, "_copy_into", copied_again)
    _no_sample_path(monkeypatch)
    for threads in (1, 2):
        batches = collect(Loader(ds, batch_size=16, seed=2, num_threads=threads,
                                 transform=DecodeImage(channels=kind)))  # type: ignore[arg-type]
        assert sorted(record_ids(batches)) == list(range(70))
        for batch in batches:
            for image, index in zip(batch["image"], batch["index"]):
                np.testing.assert_array_equal(image, _pixels(int(index), kind))
