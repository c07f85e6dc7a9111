"""Patches' images read and decoded by the compiled call: the Python path's bytes at every
scale and subsampling, for threads and processes; what the call does not take (damage, a bad
CRC, PNG, CMYK and grey JPEGs, too many pixels, masks) goes the Python path, with its
errors; a machine whose libjpeg gives other pixels does not use the call."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import simplejpeg

from shardfeed.dataset import Dataset
from shardfeed.errors import CorruptRecordError, DecodeError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader, native_patches
from shardfeed.pipeline.patch_ahead import DECODE_AHEAD_THREADS
from shardfeed.pipeline.patches import Patches
from tests.dataset.test_rewritten_shards import replace_then_next_epoch_raises
from tests.pipeline.test_patches import photo, run

pytestmark = pytest.mark.skipif(native_patches.compiled is None,
                                reason="the compiled record decode is not built")


class Counting:
    """The compiled module, its decodes counted (taken, and not taken)."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.taken = self.missed = 0

    def decode(self, *args: Any) -> Any:
        got = self.module.decode(*args)
        if got is None:
            self.missed += 1
        else:
            self.taken += 1
        return got


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch) -> Counting:
    assert native_patches.agrees()  # the process's check made before the counting starts
    counting = Counting(native_patches.compiled)
    monkeypatch.setattr(native_patches, "compiled", counting)
    return counting


def jpeg(pixels: np.ndarray, subsampling: str = "420") -> bytes:
    return bytes(simplejpeg.encode_jpeg(pixels, quality=90, colorsubsampling=subsampling))


def write(folder: Path, images: list[bytes], *, masks: bool = False) -> Dataset:
    folder.mkdir(parents=True, exist_ok=True)
    for s, part in enumerate((images[: len(images) // 2], images[len(images) // 2 :])):
        with ShardWriter(str(folder / f"p-{s}.tfrecord")) as writer:
            for i, encoded in enumerate(part):
                index = s * (len(images) // 2) + i
                features: dict[str, Any] = {"image/encoded": encoded, "index": [index],
                                            "score": [index / 3, 0.5]}
                if masks:
                    height, width, _, _ = simplejpeg.decode_jpeg_header(encoded)
                    blank = np.zeros((height, width), np.uint8)
                    features["mask/encoded"] = cv2.imencode(".png", blank)[1].tobytes()
                writer.write_example(features)
    return Dataset(str(folder))


def photos(count: int = 10) -> list[bytes]:
    """JPEGs of sizes that are not whole blocks, in each subsampling."""
    sizes = [(91, 133), (120, 97), (64, 64), (150, 171)]
    kinds = ["420", "422", "444"]
    return [jpeg(photo(i, *sizes[i % len(sizes)]), kinds[i % len(kinds)]) for i in range(count)]


def both(ds: Dataset, monkeypatch: pytest.MonkeyPatch, **options: Any) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]]]:
    """The batches with the compiled call, then by the Python path alone."""
    loader = options.pop("loader", {})
    native = run(Patches(ds, **options), **loader)
    with monkeypatch.context() as patch:
        patch.setattr(native_patches, "compiled", None)
        python = run(Patches(ds, **options), **loader)
    return native, python


def errors(monkeypatch: pytest.MonkeyPatch, counted: Counting, error: type[Exception],
           read: Any) -> list[str]:
    """The messages of ``error`` that ``read()`` raises with the compiled call, then by the
    Python path alone."""
    messages = []
    for compiled in (counted, None):
        monkeypatch.setattr(native_patches, "compiled", compiled)
        with pytest.raises(error) as caught:
            read()
        messages.append(str(caught.value))
    return messages


def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            assert np.asarray(x[key]).tobytes() == np.asarray(y[key]).tobytes(), key
            assert np.asarray(x[key]).dtype == np.asarray(y[key]).dtype, key


@pytest.mark.parametrize("scale", [None, (2.5, 3.0), (4.0, 5.0), (8.0, 9.0)])
def test_the_compiled_calls_patches_are_the_python_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: Counting,
        scale: tuple[float, float] | None) -> None:
    """Every scale (1, and DCT scales 1/2, 1/4, 1/8), each subsampling: the same patches,
    boxes and other features, with every image decoded by the call."""
    ds = write(tmp_path / "d", photos())
    native, python = both(ds, monkeypatch, size=6, scale=scale, cache_images=3,
                          refresh_every=4, loader={"num_threads": 2})
    same(native, python)
    assert counted.taken >= 10 and counted.missed == 0


def test_process_workers_and_no_cache_give_the_same_patches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = write(tmp_path / "d", photos(8))
    threads = run(Patches(ds, size=8, cache_images=3, refresh_every=4))
    uncached = run(Patches(ds, size=8, cache_images=3, refresh_every=4, cache=False))
    processes = run(Patches(ds, size=8, cache_images=3, refresh_every=4), num_threads=2,
                    workers="processes")
    _, python = both(ds, monkeypatch, size=8, cache_images=3, refresh_every=4)
    same(threads, python)
    same(uncached, python)
    same(processes, python)


def test_records_the_call_does_not_take_give_the_python_paths_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: Counting) -> None:
    """A PNG, a grey JPEG and a CMYK one among plain JPEGs: each by the path that takes it,
    the batches the Python path's."""
    images = photos(8)
    images[1] = cv2.imencode(".png", photo(1))[1].tobytes()
    images[3] = bytes(simplejpeg.encode_jpeg(np.ascontiguousarray(photo(3)[:, :, :1]),
                                             colorspace="GRAY"))
    cmyk = np.ascontiguousarray(np.dstack([photo(5), photo(5)[:, :, :1]]))
    ok, encoded = cv2.imencode(".jpg", cmyk)  # OpenCV writes 4 channels as CMYK
    images[5] = encoded.tobytes() if ok else images[5]
    ds = write(tmp_path / "d", images)
    native, python = both(ds, monkeypatch, size=6, cache_images=3, refresh_every=4)
    same(native, python)
    assert counted.taken >= 5 and counted.missed >= 2


def test_a_damaged_jpeg_is_named_as_the_python_path_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: Counting) -> None:
    images = photos(6)
    images[4] = images[4][: len(images[4]) // 2]  # cut short: no end-of-image marker
    ds = write(tmp_path / "d", images)
    messages = errors(monkeypatch, counted, DecodeError,
                      lambda: run(Patches(ds, size=6, cache_images=2, refresh_every=3)))
    assert messages[0] == messages[1] and "p-1.tfrecord', record 1" in messages[0]
    assert counted.taken >= 3 and counted.missed >= 1


def test_a_bad_crc_is_named_as_the_python_path_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: Counting) -> None:
    write(tmp_path / "d", photos(40))  # past the records a schema is inferred from
    path = tmp_path / "d" / "p-1.tfrecord"
    raw = bytearray(path.read_bytes())
    raw[len(raw) - 300] ^= 0x10  # inside the last record's JPEG
    path.write_bytes(bytes(raw))
    messages = errors(monkeypatch, counted, CorruptRecordError,
                      lambda: run(Patches(Dataset(str(tmp_path / "d")), size=6,
                                          cache_images=2, refresh_every=3)))
    assert messages[0] == messages[1] and "p-1.tfrecord', record 19" in messages[0]
    assert counted.missed >= 1


def test_an_image_over_max_pixels_is_refused_as_the_python_path_refuses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: Counting) -> None:
    ds = write(tmp_path / "d", photos(6))
    messages = errors(monkeypatch, counted, DecodeError,
                      lambda: run(Patches(ds, size=6, cache_images=2, refresh_every=3,
                                          max_pixels=4_000)))
    assert messages[0] == messages[1] and "pixels" in messages[0]
    assert counted.taken == 0 and counted.missed >= 1


def test_a_dataset_with_masks_or_pngs_is_not_asked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: Counting) -> None:
    """Masks: the call is never asked. PNGs only: asked until ``MAX_MISSES`` misses (a few
    more where the decode threads ask at once), then not again for the other images."""
    masked = write(tmp_path / "m", photos(6), masks=True)
    run(Patches(masked, size=4, cache_images=2, refresh_every=3))
    assert counted.taken == counted.missed == 0
    pngs = write(tmp_path / "p", [cv2.imencode(".png", photo(i))[1].tobytes()
                                  for i in range(40)])
    run(Patches(pngs, size=4, cache_images=2, refresh_every=3), num_threads=1)
    most = native_patches.MAX_MISSES + DECODE_AHEAD_THREADS  # each thread's last ask
    assert counted.taken == 0 and native_patches.MAX_MISSES <= counted.missed <= most < 40


def test_a_libjpeg_with_other_pixels_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: Counting) -> None:
    """The check of the process: where the call's pixels differ from simplejpeg's, it is
    not used (and the patches are the Python path's)."""
    assert native_patches.agrees()
    real = Counting.decode

    def off_by_one(self: Counting, *args: Any) -> Any:
        got = real(self, *args)
        if got is not None:
            got[0][0] ^= 1
        return got

    native_patches.agrees.cache_clear()
    monkeypatch.setattr(Counting, "decode", off_by_one)
    try:
        assert not native_patches.agrees()
        taken = counted.taken
        ds = write(tmp_path / "d", photos(6))
        native, python = both(ds, monkeypatch, size=6, cache_images=2, refresh_every=3)
        same(native, python)
        assert counted.taken == taken
    finally:
        native_patches.agrees.cache_clear()  # the process's own answer for the next tests


def test_a_dataset_that_reads_its_records_its_own_way_is_read_its_way(
        tmp_path: Path, counted: Counting) -> None:
    """A Dataset subclass whose read_many changes the records: its records, not the maps'."""
    write(tmp_path / "d", photos(6))

    class Shifted(Dataset):
        def read_many(self, indices: Any) -> list[dict[str, Any]]:
            records = super().read_many(indices)
            for record in records:
                record["index"] = record["index"] + 100
            return records

    batches = run(Patches(Shifted(str(tmp_path / "d")), size=6, cache_images=2,
                          refresh_every=3))
    assert all(int(i) >= 100 for b in batches for i in b["index"])
    assert counted.taken == counted.missed == 0


# Y sampled 1x1, Cb 2x2, Cr 1x1 (libjpeg's encoder writes it; simplejpeg's header reader
# names no subsampling for it and refuses it), 24x16
ODD_SAMPLING = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAMCAgMCAgMDAwMEAwMEBQgFBQQEBQoHBwYIDAoMDAsKCwsNDhIQDQ4R"
    "DgsLEBYQERMUFRUVDA8XGBYUGBIUFRT/2wBDAQMEBAUEBQkFBQkUDQsNFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU"
    "FBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBT/wAARCAAQABgDAREAAiIBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAA"
    "AAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAk"
    "M2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKT"
    "lJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QA"
    "HwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdh"
    "cRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hp"
    "anN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk"
    "5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwDw/wAB/s1f6v8A0X0/hrnp4jzPVpYjzPhKeIPVp4g+c4a41+H3"
    "j3jRP2av9AT/AEX/AMdr7uliAPmaeIA/pbLuNf3C98//2Q==")


def test_a_sampling_simplejpeg_refuses_is_refused_as_it_refuses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: Counting) -> None:
    """libjpeg decodes any sampling; simplejpeg's header reader names five and refuses the
    others: such a JPEG is the Python path's error, not pixels."""
    images = photos(6)
    images[4] = ODD_SAMPLING
    ds = write(tmp_path / "d", images)
    messages = errors(monkeypatch, counted, DecodeError,
                      lambda: run(Patches(ds, size=6, cache_images=2, refresh_every=3)))
    assert messages[0] == messages[1] and "JPEG header" in messages[0]
    assert counted.missed >= 1


def test_images_under_8_pixels_at_a_dct_scale_are_the_python_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: Counting) -> None:
    """Under 8 pixels a side, simplejpeg decodes "1/d" at another k/8 of the same size: the
    Python path's pixels, by the Python path."""
    images = [jpeg(photo(i, *size)) for i, size in
              enumerate([(5, 7), (3, 3), (7, 30), (30, 6), (4, 4), (12, 12)])]
    ds = write(tmp_path / "d", images)
    native, python = both(ds, monkeypatch, size=2, scale=(2.0, 2.5), cache_images=2,
                          refresh_every=3)
    same(native, python)
    assert counted.missed >= 5 and counted.taken >= 1


@pytest.mark.parametrize("options", [{"features": ["image/encoded", "index"]},
                                     {"verify_crc": False}])
def test_a_dataset_of_some_features_or_unchecked_crcs_gives_the_same_patches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: Counting,
        options: dict[str, Any]) -> None:
    write(tmp_path / "d", photos(8))
    ds = Dataset(str(tmp_path / "d"), **options)
    native, python = both(ds, monkeypatch, size=6, cache_images=3, refresh_every=4)
    same(native, python)
    assert counted.taken >= 8


def test_a_closed_dataset_is_not_read_through_its_maps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: Counting) -> None:
    """Closed, a Dataset's maps stay readable while a reader holds them: the call is not
    asked, and the Python path says the Dataset is closed."""
    ds = write(tmp_path / "d", photos(6))
    patches = Patches(ds, size=6, cache_images=2, refresh_every=3)
    assert patches._native.load(ds, 1) is not None
    ds.close()
    taken = counted.taken
    assert patches._native.load(ds, 1) is None
    messages = errors(monkeypatch, counted, ValueError,
                      lambda: run(Patches(ds, size=6, cache_images=2, refresh_every=3)))
    assert messages[0] == messages[1] and counted.taken == taken


def test_a_shard_replaced_under_its_map_raises(tmp_path: Path, counted: Counting) -> None:
    """The map of a replaced shard keeps the old bytes: the call's read is checked as the
    Python path's is (ShardChangedError), not handed on."""
    images = photos(24)  # more than the cache holds: the next epoch reads again
    old = write(tmp_path / "old", images)
    # the same records in another order within each shard: each shard keeps its size
    write(tmp_path / "new", images[11::-1] + images[:11:-1])
    shard = tmp_path / "old" / "p-0.tfrecord"
    patches = Patches(old, size=6, cache_images=2, refresh_every=3)
    with Loader(patches, batch_size=4, seed=2) as loader:
        assert sum(len(b["image"]) for b in loader) > 0
        assert counted.taken > 0
        replace_then_next_epoch_raises(shard, tmp_path / "new" / "p-0.tfrecord", loader)
