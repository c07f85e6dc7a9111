"""Small images through the Loader's cheaper per-sample path: the same samples as the plain
definition (record at order[p], transformed with sample_rng(seed, epoch, p)) for any thread
count, no generator built for pipelines that never draw, and the same errors as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.dataset import Dataset
from shardfeed.errors import SchemaError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.pipeline import samplers as source_module
from shardfeed.pipeline.batching import BatchBuffer, BatchLayout
from shardfeed.sampling import crop_draws
from shardfeed.sampling.keys import sample_rng
from shardfeed.sampling.permutation import EpochOrder
from shardfeed.transforms import presets
from shardfeed.transforms.base import NO_RANDOMNESS

N = 90
SEED = 5


def _digit(i: int) -> np.ndarray:
    image = np.zeros((12, 10), np.uint8)
    cv2.putText(image, str(i % 10), (1, 10), cv2.FONT_HERSHEY_PLAIN, 0.8, 200 + i % 50, 1)
    image[0, 0] = i  # every record's pixels differ
    return image


@pytest.fixture(scope="module")
def png_ds(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder: Path = tmp_path_factory.mktemp("pngsmall")
    for s, (lo, hi) in enumerate(((0, 40), (40, N))):
        with ShardWriter(str(folder / f"part-{s}.tfrecord")) as writer:
            for i in range(lo, hi):
                writer.write_example({
                    "image/encoded": cv2.imencode(".png", _digit(i))[1].tobytes(),
                    "image/filename": f"d{i:03d}.png".encode(),
                    "image/class/label": [i % 10],
                    "index": [i],
                    "score": np.array([i / 7.0, -i], dtype=np.float32),
                })
    ds = Dataset(str(folder))
    yield ds
    ds.close()


def _epochs(ds: Any, transform: Any, *, threads: int, shuffle: bool = True,
            epochs: tuple[int, ...] = (0, 2)) -> list[dict[str, Any]]:
    loader = Loader(ds, batch_size=16, shuffle=shuffle, seed=SEED, transform=transform,
                    num_threads=threads)
    out: list[dict[str, Any]] = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out.extend(loader)
    loader.close()
    return out


def _reference(ds: Any, transform: Any, *, shuffle: bool = True,
               epochs: tuple[int, ...] = (0, 2)) -> list[dict[str, Any]]:
    """The definition, one sample at a time."""
    bound = transform.bind(ds.schema, root=None) if transform is not None else None
    samples = []
    for epoch in epochs:
        order = EpochOrder(len(ds), seed=SEED, epoch=epoch, shuffle=shuffle)
        for p in range(len(ds)):
            record = dict(ds[int(order[p])])
            samples.append(record if bound is None else bound(record, sample_rng(SEED, epoch, p)))
    return samples


@pytest.mark.parametrize("preset", ["none", "train", "eval"])
def test_batches_are_the_definition_for_any_thread_count(png_ds: Any, preset: str) -> None:
    make = {"none": lambda: None, "train": lambda: presets.train(size=8),
            "eval": lambda: presets.eval(size=8)}[preset]
    shuffle = preset != "eval"
    want = _reference(png_ds, make(), shuffle=shuffle)
    for threads in (1, 3):
        batches = _epochs(png_ds, make(), threads=threads, shuffle=shuffle)
        got = [{k: (v[r] if isinstance(v, (np.ndarray, list)) else v) for k, v in b.items()}
               for b in batches for r in range(len(b["index"]))]
        assert len(got) == len(want) == 2 * N
        for g, w in zip(got, want):
            assert set(g) == set(w)
            assert int(g["index"]) == int(w["index"][0])
            assert g["image/filename"] == w["image/filename"]
            np.testing.assert_array_equal(g["score"], w["score"])
            if preset != "none":
                np.testing.assert_array_equal(g["image"], w["image"])
            else:
                assert g["image/encoded"] == w["image/encoded"]


def test_no_generator_is_built_when_the_pipeline_never_draws(
    png_ds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []
    real = source_module.SampleKey.rng

    def counting(self: Any, purpose: int = 0) -> np.random.Generator:
        built.append(self.position)
        return real(self, purpose)

    monkeypatch.setattr(source_module.SampleKey, "rng", counting)
    real_rows = crop_draws.sample_rng

    def counting_rows(seed: int, epoch: int, position: int,
                      purpose: int = 0) -> np.random.Generator:
        built.append(position)  # the batch path's generators, one a row asked for
        return real_rows(seed, epoch, position, purpose)

    monkeypatch.setattr(crop_draws, "sample_rng", counting_rows)
    _epochs(png_ds, presets.eval(size=8), threads=2, epochs=(0,))
    assert built == []
    _epochs(png_ds, presets.train(size=8), threads=2, epochs=(0,))
    assert set(built) == set(range(N))  # (the layout probe builds position 0 once more)


class _Liar:
    """Declares that it never draws, then draws."""

    draws_random = False

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        sample["noise"] = rng.random()
        return sample


def test_a_transform_that_draws_after_declaring_it_does_not_fails_loudly(png_ds: Any) -> None:
    loader = Loader(png_ds, batch_size=8, shuffle=True, seed=0, transform=_Liar(),
                    num_threads=2)
    with pytest.raises(RuntimeError, match="draws_random = False") as info:
        next(iter(loader))
    assert any("epoch position" in note for note in getattr(info.value, "__notes__", []))
    loader.close()
    assert repr(NO_RANDOMNESS) == "NO_RANDOMNESS"


def test_a_sample_with_other_keys_is_still_a_schema_error() -> None:
    first = {"image": np.zeros((2, 2, 3), np.uint8), "label": np.array([1]), "name": b"a"}
    buffer = BatchBuffer(BatchLayout.infer(first, batch_size=4))
    buffer.write(0, first, where="epoch position 0")
    for other in ({"image": first["image"], "label": np.array([2])},
                  {**first, "extra": 1},
                  {"image": first["image"], "label": np.array([2]), "nome": b"b"}):
        with pytest.raises(SchemaError, match="every sample must have the same keys"):
            buffer.write(1, other, where=lambda: "epoch position 1")
    assert buffer.take(1, copy=True)["name"] == [b"a"]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 2**64 - 1),
       position=st.integers(0, 2**64 - 1), purpose=st.integers(0, 5))
def test_sample_rng_is_philox_with_the_documented_key(
    seed: int, epoch: int, position: int, purpose: int
) -> None:
    fast = sample_rng(seed, epoch, position, purpose)
    plain = np.random.Generator(np.random.Philox(
        key=np.array([seed, purpose], dtype=np.uint64),
        counter=np.array([0, 0, position, epoch], dtype=np.uint64),
    ))
    a, b = fast.bit_generator.state, plain.bit_generator.state
    np.testing.assert_array_equal(a["state"]["key"], b["state"]["key"])
    np.testing.assert_array_equal(a["state"]["counter"], b["state"]["counter"])
    assert (a["buffer_pos"], a["has_uint32"]) == (b["buffer_pos"], b["has_uint32"])
    assert fast.integers(0, 1000, 5).tolist() == plain.integers(0, 1000, 5).tolist()
    assert fast.random() == plain.random() and fast.standard_normal() == plain.standard_normal()
