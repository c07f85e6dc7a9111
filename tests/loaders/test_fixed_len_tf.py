"""The tf.data road of a FeatureSpec with a fixed shape and a default: a dense (B, 9) float32
tensor where records lack the feature, as tf.io.FixedLenFeature([9], tf.float32,
default_value=...) gives it (not a ragged one)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tensorflow
tf = pytest.importorskip("tensorflow")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from test_fixed_len_features import RECORDS, SPEC, has_vec, vec, write_records

from shardfeed.dataset import Dataset
from shardfeed.loaders import tensorflow as sf_tf
from shardfeed.pipeline import Loader


def test_tf_dataset_gives_a_dense_tensor(tmp_path: Path) -> None:
    ds = Dataset(write_records(tmp_path / "d"), features=SPEC)
    with Loader(ds, batch_size=4, transform=None, shuffle=False, drop_last=True) as loader:
        data = sf_tf.dataset(loader)
        spec = data.element_spec["vec"]
        assert isinstance(spec, tf.TensorSpec)
        assert spec.shape == (4, 9) and spec.dtype == tf.float32
        batches = [b["vec"] for b in data]
    assert all(isinstance(b, tf.Tensor) and b.shape == (4, 9) for b in batches)
    rows = np.concatenate([b.numpy() for b in batches])
    want = [vec(i) if has_vec(i) else np.full(9, -1.0, np.float32) for i in range(RECORDS)]
    np.testing.assert_array_equal(rows, np.stack(want))
