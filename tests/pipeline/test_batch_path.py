"""The batch path (records read as columns, images decoded straight into the batch rows) gives
the very batches of the sample-by-sample path, for every kind of image a user stores, on
1, 2 and 4 threads; bad records are still named or skipped exactly as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import simplejpeg
from pipeline_helpers import assert_same_batches, collect, open_dataset, record_ids

from shardfeed.dataset import Dataset
from shardfeed.errors import CorruptRecordError, DecodeError, SchemaError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.transforms import Compose, DecodeImage


def _png(image: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", image)
    assert ok
    return buf.tobytes()


def _image(i: int, kind: str) -> bytes:
    rng = np.random.default_rng(i)
    if kind == "gray-png":
        return _png(rng.integers(0, 256, (28, 28), dtype=np.uint8))
    if kind == "gray-png-trns":  # a grey PNG with a transparent grey level (tRNS chunk)
        data = _png(rng.integers(0, 256, (28, 28), dtype=np.uint8))
        chunk = b"tRNS" + (7).to_bytes(2, "big")
        import zlib

        trns = len(chunk[4:]).to_bytes(4, "big") + chunk + zlib.crc32(chunk).to_bytes(4, "big")
        return data[:33] + trns + data[33:]
    if kind == "rgb-png":
        return _png(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8))
    if kind == "rgba-png":
        return _png(rng.integers(0, 256, (28, 28, 4), dtype=np.uint8))
    if kind == "gray16-png":
        return _png(rng.integers(0, 65536, (28, 28), dtype=np.uint16))
    if kind == "jpeg":
        return bytes(simplejpeg.encode_jpeg(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)))
    raise AssertionError(kind)


def _write(folder: Path, kind: str, n: int = 70, *, bad: int | None = None,
           other_size: int | None = None) -> Dataset:
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(n):
            encoded = _image(i, kind)
            if i == bad:
                encoded = encoded[: len(encoded) // 2]
            if i == other_size:
                encoded = _png(np.zeros((27, 28), np.uint8))
            writer.write_example({"image/encoded": encoded, "label": [i % 10], "index": [i],
                                  "name": f"{i}.png".encode()})
    return Dataset(str(folder))




def _pair(ds: Dataset, channels: str, **options: Any) -> tuple[list[Any], list[Any]]:
    """Batches of the batch path and of the sample path (a plain function in the pipeline
    has no batch form)."""
    options.setdefault("batch_size", 16)
    fast = collect(Loader(ds, transform=DecodeImage(channels=channels), **options))
    slow = collect(Loader(ds, transform=Compose([DecodeImage(channels=channels),
                                                  lambda sample, rng: sample]), **options))
    return fast, slow


@pytest.mark.parametrize("kind", ["gray-png", "gray-png-trns", "rgb-png", "rgba-png",
                                  "gray16-png", "jpeg"])
@pytest.mark.parametrize("channels", ["gray", "rgb"])
def test_batch_path_gives_the_sample_paths_batches(tmp_path: Path, kind: str,
                                                   channels: str) -> None:
    ds = _write(tmp_path / kind, kind)
    fast, slow = _pair(ds, channels, num_threads=2)
    assert_same_batches(fast, slow)
    assert sorted(record_ids(fast)) == list(range(70))
    assert fast[0]["image"].shape == (16, 28, 28, 1 if channels == "gray" else 3)


def test_same_bytes_on_1_2_4_threads(tmp_path: Path) -> None:
    ds = _write(tmp_path / "g", "gray-png")
    runs = [collect(Loader(ds, batch_size=16, transform=DecodeImage(channels="gray"),
                            num_threads=t)) for t in (1, 2, 4)]
    assert_same_batches(runs[0], runs[1])
    assert_same_batches(runs[0], runs[2])


def test_transform_none_reads_columns_as_the_records_hold(tmp_path: Path) -> None:
    ds = _write(tmp_path / "g", "gray-png")
    a = collect(Loader(ds, batch_size=16, seed=1))
    b = [{k: v for k, v in r.items()} for r in ds.read_many(range(70))]
    by_index = {int(r["index"][0]): r for r in b}
    for batch in a:
        for row, index in enumerate(batch["index"]):
            assert batch["image/encoded"][row] == by_index[int(index)]["image/encoded"]
            assert batch["name"][row] == by_index[int(index)]["name"]


def test_tensorflow_written_records_through_the_batch_path(tf_fixtures: Path) -> None:
    ds = Dataset(str(tf_fixtures / "mixed.tfrecord"))
    a = collect(Loader(ds, batch_size=7, seed=2, num_threads=2))
    b = collect(Loader(ds, batch_size=7, seed=2, num_threads=2, on_error="raise",
                        transform=Compose([lambda sample, rng: sample])))
    assert_same_batches(a, b)


def test_a_damaged_image_is_still_named(tmp_path: Path) -> None:
    ds = _write(tmp_path / "bad", "gray-png", bad=33)
    with pytest.raises(DecodeError, match=r"record 33 at byte \d+"):
        collect(Loader(ds, batch_size=16, transform=DecodeImage(channels="gray")))
    fast, slow = _pair(ds, "gray", on_error="skip")
    assert_same_batches(fast, slow)
    assert 33 not in record_ids(fast)


def test_a_damaged_record_is_still_named(bad_crc_folder: Path) -> None:
    with pytest.raises(CorruptRecordError, match="record"):
        collect(Loader(open_dataset(bad_crc_folder), batch_size=8,
                        transform=DecodeImage(channels="gray")))
    fast, slow = _pair(open_dataset(bad_crc_folder), "gray", batch_size=8, on_error="skip")
    assert_same_batches(fast, slow)


def test_an_image_of_another_size_is_named(tmp_path: Path) -> None:
    ds = _write(tmp_path / "size", "gray-png", other_size=40)
    with pytest.raises(SchemaError, match=r"record 40 at byte \d+|epoch position"):
        collect(Loader(ds, batch_size=16, transform=DecodeImage(channels="gray")))


def _no_sample_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardfeed.pipeline.produce import SliceBuilder

    def refuse(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("a slice went sample by sample")

    monkeypatch.setattr(SliceBuilder, "build_samples", refuse)


@pytest.mark.parametrize("kind", ["gray-png", "rgb-png", "jpeg"])
def test_decoding_alike_records_takes_the_batch_path(tmp_path: Path, kind: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ds = _write(tmp_path / kind, kind)
    _no_sample_path(monkeypatch)
    batches = collect(Loader(ds, batch_size=16, transform=DecodeImage(channels="gray"),
                              num_threads=2))
    assert sorted(record_ids(batches)) == list(range(70))


def test_tensorflow_written_records_take_the_batch_path(tf_fixtures: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ds = Dataset(str(tf_fixtures / "mixed.tfrecord"))
    _no_sample_path(monkeypatch)
    assert len(collect(Loader(ds, batch_size=7, seed=2))) == 3


def test_max_pixels_still_refuses_on_the_batch_path(tmp_path: Path) -> None:
    ds = _write(tmp_path / "g", "gray-png")
    loader = Loader(ds, batch_size=16, transform=DecodeImage(channels="gray", max_pixels=700))
    with pytest.raises(DecodeError, match=r"refusing to decode image.*record \d+ at byte \d+"):
        collect(loader)


class _Fussy(DecodeImage):
    """A user's decode op with a batch form that has a bug: ValueError on record 5."""

    def __call__(self, sample: dict[str, Any], rng: Any, /) -> dict[str, Any]:
        if int(sample["index"][0]) == 5:
            raise ValueError("bad option for this image")
        return super().__call__(sample, rng)

    def apply_batch(self, columns: dict[str, Any], rngs: Any, out: Any) -> dict[str, Any] | None:
        if 5 in columns["index"]:
            raise ValueError("bad option for this image")
        return super().apply_batch(columns, rngs, out)


def test_a_bug_in_a_batch_form_still_names_the_record(tmp_path: Path) -> None:
    ds = _write(tmp_path / "g", "gray-png")
    with pytest.raises(ValueError, match="bad option") as caught:
        collect(Loader(ds, batch_size=16, shuffle=False, transform=_Fussy(channels="gray")))
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "epoch position 5" in notes and "record 5" in notes, notes


def test_the_batch_path_turned_off_by_another_thread_mid_slice(tmp_path: Path) -> None:
    # One thread finds columns with no batch form and turns the path off while another is
    # between deciding to take it and reading: that slice still completes, with its rows.
    from shardfeed.pipeline.batching import BatchBuffer

    ds = _write(tmp_path / "g", "gray-png")
    loader = Loader(ds, batch_size=16, shuffle=False, transform=DecodeImage(channels="gray"))
    first = collect(Loader(ds, batch_size=16, shuffle=False,
                           transform=DecodeImage(channels="gray")))[0]
    next(iter(loader))
    builder = loader._builder
    plan = builder.sampler.plan

    def plan_then_turn_off(*args: Any) -> Any:
        builder._read_columns = None  # what the other thread does
        return plan(*args)

    builder.sampler.plan = plan_then_turn_off  # type: ignore[method-assign]
    assert loader._layout is not None
    buffer = BatchBuffer(loader._layout)
    builder.build_slice(loader._context(), np.arange(16, dtype=np.int64), buffer, 0)
    np.testing.assert_array_equal(buffer.arrays["image"], first["image"])
    loader.close()


@pytest.mark.parametrize("kind", ["gray-png", "rgb-png", "gray-png-trns"])
def test_a_package_built_without_a_c_compiler_gives_the_same_batches(
        tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user whose install could not compile the C parts gets the batches everyone else
    gets, a damaged image skipped in the same place, batches kept in a list."""
    from shardfeed.format import native
    from shardfeed.transforms.decode import png_rows

    ds = _write(tmp_path / kind, kind, bad=9)
    channels = "rgb" if kind == "rgb-png" else "gray"

    def run() -> list[Any]:
        return collect(Loader(ds, batch_size=16, transform=DecodeImage(channels=channels),
                              num_threads=2, on_error="skip", seed=3))

    compiled = run()
    monkeypatch.setattr(native, "wire", None)
    monkeypatch.setattr(png_rows, "compiled", None)
    assert_same_batches(compiled, run())
    assert 9 not in record_ids(compiled)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_flip_after_a_fixed_size_decode_gives_the_sample_paths_batches(
        tmp_path: Path, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """RandomHorizontalFlip has a batch form: after an op of fixed-size output (a centre
    crop) the rows are flipped a slice at a time, each row's flip drawn from its generator,
    and the batches are those of the same pipeline made sample by sample."""
    from shardfeed.transforms import RandomHorizontalFlip, presets

    batched: list[bool] = []
    form = RandomHorizontalFlip.apply_batch

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = form(self, *args, **kwargs)
        batched.append(result is not None)
        return result

    monkeypatch.setattr(RandomHorizontalFlip, "apply_batch", counted)
    ds = _write(tmp_path / "d", "jpeg")
    pipeline = [presets.eval(size=24), RandomHorizontalFlip(0.5)]
    fast = collect(Loader(ds, transform=Compose(pipeline), batch_size=16, seed=3,
                          shuffle=True, num_threads=threads))
    assert batched and all(batched)  # every slice flipped by the batch form
    slow = collect(Loader(ds, transform=Compose([*pipeline, lambda sample, rng: sample]),
                          batch_size=16, seed=3, shuffle=True, num_threads=threads))
    assert_same_batches(fast, slow)
    plain = collect(Loader(ds, transform=presets.eval(size=24), batch_size=16, seed=3,
                           shuffle=True, num_threads=threads))
    flipped = sum(not np.array_equal(a["image"][i], b["image"][i])
                  for a, b in zip(fast, plain) for i in range(len(a["image"])))
    assert 0 < flipped < sum(len(a["image"]) for a in fast)
