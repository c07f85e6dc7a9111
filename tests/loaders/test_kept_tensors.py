"""torch tensors and JAX arrays the caller keeps never change; adapter options fail early.

The reference is the loader's NumPy stream with every batch copied as it is handed out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import open_dataset, record_ids, train_transform

from shardfeed.pipeline import Loader

OPTIONS: dict[str, Any] = {"batch_size": 8, "seed": 1, "num_threads": 2, "prefetch_batches": 2}
SIZE = 96  # 8 images of 96x96x3 are more than the 64 KiB a batch that small columns may be


def make_loader(folder: Path, workers: str = "threads") -> Loader:
    return Loader(open_dataset(folder), transform=train_transform(SIZE), workers=workers,
                  **OPTIONS)


def reference(folder: Path) -> list[dict[str, Any]]:
    with make_loader(folder) as loader:
        return [{k: v.copy() for k, v in b.items() if isinstance(v, np.ndarray)} for b in loader]


def check_kept(kept: list[dict[str, Any]], expected: list[dict[str, Any]], *,
               channels_first: bool = False) -> None:
    assert len(kept) == len(expected) == 4
    for k, (got, want) in enumerate(zip(kept, expected)):
        for name, value in want.items():
            array = np.asarray(got[name])
            if channels_first and name == "image":
                array = np.moveaxis(array, 1, -1)
            np.testing.assert_array_equal(array, value, err_msg=f"batch {k}, {name!r}")
    assert sorted(record_ids(kept)) == list(range(30))


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_torch_tensors_kept_in_a_list(adapter_folder: Path, workers: str) -> None:
    pytest.importorskip("torch")
    from shardfeed.loaders import torch as torch_adapter

    with torch_adapter.adapt(make_loader(adapter_folder, workers)) as adapted:
        kept = list(adapted)
    check_kept(kept, reference(adapter_folder))


def test_torch_channels_first_tensors_are_contiguous_and_kept(adapter_folder: Path) -> None:
    torch = pytest.importorskip("torch")
    from shardfeed.loaders import torch as torch_adapter

    with torch_adapter.adapt(make_loader(adapter_folder), channels_first=True) as adapted:
        kept = list(adapted)
    for batch in kept:
        image = batch["image"]
        assert isinstance(image, torch.Tensor) and tuple(image.shape[1:]) == (3, SIZE, SIZE)
        assert image.is_contiguous()
        assert image.view(image.shape[0], -1).shape[1] == 3 * SIZE * SIZE  # view() needs contiguity
    check_kept(kept, reference(adapter_folder), channels_first=True)


def test_torch_labels_and_image_views_appended_per_batch(adapter_folder: Path) -> None:
    pytest.importorskip("torch")
    from shardfeed.loaders import torch as torch_adapter

    labels, firsts = [], []
    with torch_adapter.adapt(make_loader(adapter_folder)) as adapted:
        for batch in adapted:
            labels.append(batch["image/class/label"])
            firsts.append(batch["image"][0])
    expected = reference(adapter_folder)
    for k, want in enumerate(expected):
        np.testing.assert_array_equal(labels[k].numpy(), want["image/class/label"])
        np.testing.assert_array_equal(firsts[k].numpy(), want["image"][0], err_msg=f"batch {k}")


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_jax_arrays_kept_in_a_list(adapter_folder: Path, workers: str) -> None:
    jax = pytest.importorskip("jax")
    from shardfeed.loaders import jax as jax_adapter

    with jax_adapter.adapt(make_loader(adapter_folder, workers)) as adapted:
        kept = list(adapted)
    assert all(isinstance(b["image"], jax.Array) for b in kept)
    expected = reference(adapter_folder)
    for batch in expected:  # JAX's default dtypes: int64 becomes int32 without x64
        for name, value in batch.items():
            if value.dtype == np.int64 and not jax.config.jax_enable_x64:
                batch[name] = value.astype(np.int32)
    check_kept(kept, expected)


def test_torch_device_without_it_fails_at_adapt(loader: Any) -> None:
    torch = pytest.importorskip("torch")
    from shardfeed.loaders import torch as torch_adapter

    # a CUDA device this machine does not have: CUDA itself, or one past the last GPU
    missing = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    with pytest.raises(ValueError, match=rf"device={missing!r}.*device=None"):
        torch_adapter.adapt(loader, device=missing)
    with pytest.raises(ValueError, match=r"device='gpu'.*'cuda'"):
        torch_adapter.adapt(loader, device="gpu")
    batch = next(iter(torch_adapter.adapt(loader, device="cpu")))
    assert batch["image"].device.type == "cpu"
