"""Small PNG and raw records are built a slice in one compiled call (pipeline/_slice.c, no GIL
held): the batches are those of the batch and sample paths, byte for byte, on any number of
threads; a record the call does not take (bad CRC, a PNG outside the plain kind, another
shape) is built, named or skipped by those paths exactly as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from pipeline_helpers import assert_same_batches, collect

from shardfeed.dataset import Dataset
from shardfeed.errors import CorruptRecordError, SchemaError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader, native_slices
from shardfeed.tools.pack import pack
from shardfeed.tools.pack.rows import RowFields
from shardfeed.transforms import DecodeImage

pytestmark = pytest.mark.skipif(native_slices.compiled is None,
                                reason="built without the compiled slice")


def _digits(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8)
    pixels[:, 10:18] //= 4  # some structure: PNG filters other than None get used
    return pixels, np.arange(n, dtype=np.int64) % 10


def _packed(folder: Path, encode: str, n: int = 300) -> Path:
    pack(_digits(n), str(folder), records_per_shard=120, overwrite=True,
         fields=RowFields(encode=encode))  # type: ignore[arg-type]
    return folder


def _run(folder: Path, *, native: bool, threads: int = 2, channels: str = "gray",
         **options: Any) -> tuple[list[dict[str, Any]], Any]:
    ds = Dataset(str(folder))
    loader = Loader(ds, batch_size=32, seed=4, shuffle=True, num_threads=threads,
                    transform=DecodeImage(channels=channels),  # type: ignore[arg-type]
                    **options)
    made = loader._builder._native
    if not native:
        loader._builder._native = None
    batches = collect(loader)
    ds.close()
    return batches, made


@pytest.mark.parametrize("encode", ["png", "raw"])
@pytest.mark.parametrize("threads", [1, 3])
def test_native_slices_are_the_batch_paths_bytes(tmp_path: Path, encode: str,
                                                 threads: int) -> None:
    folder = _packed(tmp_path / encode, encode)
    fast, native = _run(folder, native=True, threads=threads)
    slow, _ = _run(folder, native=False, threads=threads)
    assert_same_batches(fast, slow)
    assert native is not None and native.enabled and native._missed == 0
    assert native._built >= len(fast)  # every slice was built by the compiled call
    pixels, labels = _digits(300)
    row = fast[0]
    index = int(np.flatnonzero((pixels == row["image"][0]).all(axis=(1, 2, 3)))[0])
    assert row["label"][0] == labels[index]
    assert sorted(int(i) for b in fast for i in b["label"]) == sorted(labels.tolist())


def test_same_bytes_on_1_2_4_threads(tmp_path: Path) -> None:
    folder = _packed(tmp_path / "png", "png")
    runs = [_run(folder, native=True, threads=t)[0] for t in (1, 2, 4)]
    assert_same_batches(runs[0], runs[1])
    assert_same_batches(runs[0], runs[2])


def test_a_bad_crc_is_named_as_before(tmp_path: Path) -> None:
    folder = _packed(tmp_path / "png", "png")
    shard = sorted(folder.glob("*.tfrecord"))[1]
    offsets = np.load(str(shard) + ".idx.npy")
    with open(shard, "r+b") as fh:  # a byte of record 7's payload
        fh.seek(int(offsets[7]) + 12 + 30)
        byte = fh.read(1)
        fh.seek(int(offsets[7]) + 12 + 30)
        fh.write(bytes([byte[0] ^ 0xFF]))
    messages = []
    for native in (True, False):
        with pytest.raises(CorruptRecordError) as caught:
            _run(folder, native=native)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert shard.name in messages[0] and "record 7" in messages[0]
    fast, native = _run(folder, native=True, on_error="skip")
    slow, _ = _run(folder, native=False, on_error="skip")
    assert_same_batches(fast, slow)
    assert native is not None and native._built > 0


def _write(folder: Path, images: list[np.ndarray], **extra: Any) -> Path:
    folder.mkdir(parents=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i, image in enumerate(images):
            ok, png = cv2.imencode(".png", image)
            assert ok
            writer.write_example({
                "image/encoded": png.tobytes(), "image/filename": f"{i}.png".encode(),
                "labels": np.array([i, np.nan, -i / 3], np.float32), "index": [i], **extra})
    return folder


def test_float_and_bytes_features_come_along(tmp_path: Path) -> None:
    pixels, _ = _digits(100)
    folder = _write(tmp_path / "d", list(pixels[..., 0]))
    fast, native = _run(folder, native=True)
    slow, _ = _run(folder, native=False)
    assert_same_batches(fast, slow)
    assert native is not None and native._built > 0 and native._missed == 0
    row = fast[0]
    i = int(row["index"][0])
    assert row["image/filename"][0] == f"{i}.png".encode()
    assert row["labels"].dtype == np.float32 and np.isnan(row["labels"][0, 1])
    np.testing.assert_array_equal(row["image"][0], pixels[i])


def _tag(i: int) -> bytes:
    """A bytes feature that repeats in runs, as image/format does: equal small values, an
    empty one, values of one size that differ, long ones."""
    return [b"png", b"png", b"PNG", b"", b"", b"x" * 700, b"x" * 700, b"y" * 700,
            b"pn", b"png"][i % 10]


def test_bytes_columns_equal_to_the_row_before_are_right_and_shared(tmp_path: Path) -> None:
    """A bytes value equal to the row before's is that row's object (no allocation a row in
    the compiled call, no free a row where the batch is dropped); every value is still the
    record's own, whatever its neighbours."""
    pixels, _ = _digits(100)
    folder = tmp_path / "d"
    folder.mkdir()
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i, image in enumerate(pixels[..., 0]):
            ok, png = cv2.imencode(".png", image)
            assert ok
            writer.write_example({"image/encoded": png.tobytes(), "index": [i],
                                  "tag": _tag(i), "run": b"same" if i % 7 else b"odd"})
    for native in (True, False):
        batches, made = _run(folder, native=native, threads=1)  # a batch a slice
        if native:
            assert made is not None and made._built > 0 and made._missed == 0
        shared = equal = 0
        for batch in batches:
            indices = [int(i) for i in batch["index"]]
            assert batch["tag"] == [_tag(i) for i in indices]
            assert batch["run"] == [b"same" if i % 7 else b"odd" for i in indices]
            pairs = list(zip(batch["run"], batch["run"][1:]))
            shared += sum(a is b for a, b in pairs)
            equal += sum(a == b for a, b in pairs)
        assert shared == equal > 40, native


def test_a_png_outside_the_plain_kind_takes_the_other_path(tmp_path: Path) -> None:
    pixels, _ = _digits(100)
    images = list(pixels[..., 0])
    images[17] = (images[17].astype(np.uint16) * 257)  # a 16-bit PNG among 8-bit ones
    folder = _write(tmp_path / "d", images)
    fast, native = _run(folder, native=True, threads=1)
    slow, _ = _run(folder, native=False, threads=1)
    assert_same_batches(fast, slow)
    assert native is not None and native._missed == 1 and native.enabled


def test_data_it_never_takes_turns_it_off(tmp_path: Path) -> None:
    """Grey PNGs decoded to RGB are OpenCV's: the compiled call hands back a few slices, then
    is not tried again; the batches are unchanged."""
    pixels, _ = _digits(200)
    folder = _write(tmp_path / "d", list(pixels[..., 0]))
    fast, native = _run(folder, native=True, channels="rgb")
    slow, _ = _run(folder, native=False, channels="rgb")
    assert_same_batches(fast, slow)
    assert native is not None and not native.enabled
    assert native._missed <= native_slices.MAX_MISSES + 1  # threads racing: one more at most


def test_a_raw_record_of_another_shape_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "raw"
    folder.mkdir()
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(64):
            height = 27 if i == 21 else 28
            writer.write_example({"image/raw": bytes(height * 28), "image/height": [height],
                                  "image/width": [28], "image/channels": [1], "index": [i]})
    messages = []
    for native in (True, False):
        with pytest.raises(SchemaError, match=r"record 21 at byte \d+") as caught:
            _run(folder, native=native)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]


def test_a_closed_dataset_is_not_read_through_its_maps(tmp_path: Path) -> None:
    """Closed, a Dataset's maps stay readable while the compiled call's plan holds them: the
    next slice is left to the other paths, which say the Dataset is closed."""
    folder = _packed(tmp_path / "png", "png")
    ds = Dataset(str(folder))
    loader = Loader(ds, batch_size=32, seed=4, num_threads=1, prefetch_batches=1,
                    transform=DecodeImage(channels="gray"))  # type: ignore[arg-type]
    batches = iter(loader)
    next(batches)
    native = loader._builder._native
    assert native is not None and native._built >= 1
    built = native._built
    ds.close()
    with pytest.raises(ValueError, match="closed"):
        for _ in range(20):
            next(batches)
    assert native._built <= built + 2  # at most the slices already under way
    loader.close()
