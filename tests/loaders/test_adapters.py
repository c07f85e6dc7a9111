"""NumPy, torch and JAX adapters: types, dtypes, layout, and the loader's state kept."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from shardfeed.loaders import numpy as np_adapter


def test_numpy_batches_outlive_the_ring(loader: Any) -> None:
    adapted = np_adapter.adapt(loader)
    batches = list(adapted)
    assert len(adapted) == 4 and [len(b["index"]) for b in batches] == [8, 8, 8, 6]
    ids = np.concatenate([b["index"] for b in batches])
    assert sorted(ids.tolist()) == list(range(30))
    assert adapted.state()["epoch"] == 1 and adapted.stats().skipped == 0


def test_torch_tensors_dtypes_channels_first(loader: Any) -> None:
    torch = pytest.importorskip("torch")
    from shardfeed.loaders import torch as torch_adapter

    reference = next(iter(loader))
    reference = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in reference.items()}
    loader.set_epoch(1)
    loader.set_epoch(0)
    adapted = torch_adapter.adapt(loader, channels_first=True)
    batch = next(iter(adapted))
    assert isinstance(batch["image"], torch.Tensor)
    assert batch["image"].dtype == torch.uint8 and tuple(batch["image"].shape) == (8, 3, 32, 32)
    assert batch["image/class/label"].dtype == torch.int64
    assert tuple(batch["labels"].shape) == (8, 3) and batch["labels"].dtype == torch.float32
    assert isinstance(batch["image/filename"], list)
    np.testing.assert_array_equal(batch["image"].permute(0, 2, 3, 1).numpy(), reference["image"])
    np.testing.assert_array_equal(batch["index"].numpy(), reference["index"])
    state = adapted.state()
    assert state["consumed"] == 8


def test_torch_pin_memory_without_cuda_warns(loader: Any) -> None:
    torch = pytest.importorskip("torch")
    from shardfeed.loaders import torch as torch_adapter

    if torch.cuda.is_available():
        adapted = torch_adapter.adapt(loader, pin_memory=True)
        assert next(iter(adapted))["image"].is_pinned()
        return
    with pytest.warns(UserWarning, match="pin_memory=True has no effect"):
        adapted = torch_adapter.adapt(loader, pin_memory=True, device="cpu")
    batch = next(iter(adapted))
    assert batch["image"].device.type == "cpu"


def test_torch_adapter_restores(loader: Any) -> None:
    pytest.importorskip("torch")
    from shardfeed.loaders import torch as torch_adapter

    adapted = torch_adapter.adapt(loader)
    it = iter(adapted)
    next(it)
    state = adapted.state()
    expected = [b["index"].tolist() for b in it]
    with torch_adapter.adapt(loader) as again:
        again.restore(state)
        assert [b["index"].tolist() for b in again] == expected


def test_jax_arrays_do_not_alias_the_ring(loader: Any) -> None:
    jax = pytest.importorskip("jax")
    from shardfeed.loaders import jax as jax_adapter

    adapted = jax_adapter.adapt(loader)
    batches = list(adapted)  # later batches reuse the ring buffers of earlier ones
    assert all(isinstance(b["image"], jax.Array) for b in batches)
    assert batches[0]["image"].shape == (8, 32, 32, 3) and batches[0]["image"].dtype == np.uint8
    loader.set_epoch(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = [{k: np.asarray(v).copy() for k, v in b.items() if k != "image/filename"}
                 for b in loader]
    for got, want in zip(batches, fresh):
        np.testing.assert_array_equal(np.asarray(got["image"]), want["image"])
        np.testing.assert_array_equal(np.asarray(got["index"]), want["index"])
    assert isinstance(batches[0]["image/filename"], list)


def test_jax_batch_sharding(loader: Any) -> None:
    pytest.importorskip("jax")
    from shardfeed.loaders import jax as jax_adapter

    adapted = jax_adapter.adapt(loader, sharding="batch")
    batch = next(iter(adapted))
    assert batch["image"].sharding.is_equivalent_to(
        jax_adapter.batch_sharding(), batch["image"].ndim
    )
    with pytest.raises(ValueError, match="sharding must be"):
        jax_adapter.adapt(loader, sharding="rows")


def test_adapt_needs_a_loader() -> None:
    with pytest.raises(TypeError, match="needs a shardfeed.Loader"):
        np_adapter.adapt([1, 2, 3])
