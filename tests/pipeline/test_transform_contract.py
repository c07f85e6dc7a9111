"""The transform contract: a transform deriving from TransformBase declares every member, and
the Loader reads what it declares; a spec that fails is reported, not turned into a copy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shardfeed.pipeline import Loader
from shardfeed.transforms import Compose, DecodeImage, TransformBase, presets
from shardfeed.transforms.base import Specs


class Darken(TransformBase):
    """Halves the image; declares only that it never draws (no output spec)."""

    draws_random = False

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator, /) -> dict[str, Any]:
        sample["image"] = sample["image"] // 2
        return sample


class BrokenSpec(TransformBase):
    """A transform whose output spec has a bug."""

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator, /) -> dict[str, Any]:
        return sample

    def output_spec(self, specs: Specs) -> Specs | None:
        raise KeyError("image")


def _first_batch(ds: Any, transform: Any) -> dict[str, Any]:
    with Loader(ds, batch_size=4, seed=1, transform=transform, num_threads=1) as loader:
        return next(iter(loader))


def test_a_transform_without_output_spec_says_no_spec_and_is_batched(clean_ds: Any) -> None:
    darken = Darken()
    assert darken.output_spec({}) is None  # the base's explicit "no spec"
    assert darken.decode_bytes is None and darken.accepts_out is False
    assert darken.bind(clean_ds.schema, root=None) is darken
    plain = _first_batch(clean_ds, DecodeImage())
    dark = _first_batch(clean_ds, Compose([DecodeImage(), darken]))
    np.testing.assert_array_equal(dark["image"], plain["image"] // 2)


def test_a_failing_output_spec_is_reported(clean_ds: Any) -> None:
    transform = Compose([presets.eval(size=8), BrokenSpec()])
    with pytest.raises(KeyError, match="image"):
        _first_batch(clean_ds, transform)


def test_a_class_must_implement_call() -> None:
    class NoCall(TransformBase):
        pass

    with pytest.raises(TypeError, match="abstract"):
        NoCall()  # type: ignore[abstract]
