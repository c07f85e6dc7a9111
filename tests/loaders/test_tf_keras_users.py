"""The TensorFlow/Keras user's first steps, each in a fresh process as the user runs them:
the windows of keras.md on the tf road (per-frame file names a (B, k) ``tf.string``), the
imports users write (``import shardfeed.keras``, ``from shardfeed.torch import adapt``) and
``shardfeed.keras.adapt(loader)`` with no names (image -> x, label -> y)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tensorflow
pytest.importorskip("tensorflow")
pytest.importorskip("keras")

SHARDFEED = Path(sys.executable).parent / "shardfeed"


def _python(code: str, cwd: Path, backend: str = "tensorflow") -> dict[str, object]:
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tfusers") / "ex"
    subprocess.run([str(SHARDFEED), "examples", str(folder)], check=True, capture_output=True,
                   timeout=170)
    return folder


WINDOWS = r'''
import json
import numpy as np
import keras
import shardfeed

days = shardfeed.Dataset("days/")
windows = shardfeed.Windows(days, length=3, max_gap_seconds=12)
def loader():
    return shardfeed.Loader(windows, batch_size=4, shuffle=True, seed=0, drop_last=True,
                            transform=shardfeed.presets.train(size=32, dtype="float32"))
ds = shardfeed.tf.dataset(loader())            # every feature, file names included
spec = ds.element_spec["image/filename"]
first = next(iter(ds))
expected = next(iter(loader()))
assert first["image/filename"].numpy().tolist() == expected["image/filename"]
np.testing.assert_array_equal(first["image"].numpy(), expected["image"])

inputs = keras.Input((3, 32, 32, 3))
x = keras.layers.GlobalAveragePooling3D()(keras.layers.Conv3D(4, 3, padding="same")(inputs))
model = keras.Model(inputs, keras.layers.Dense(5)(x))
model.compile("adam", "mse")
train = loader()
trained = shardfeed.tf.dataset(train, features=["image", "labels"]).map(
    lambda b: (b["image"], b["labels"]))
history = model.fit(trained, epochs=2, shuffle=False, verbose=0)
print(json.dumps({"shape": list(spec.shape), "dtype": spec.dtype.name,
                  "epochs": len(history.history["loss"]),
                  "loader_epoch": train.epoch}))
'''


def test_windows_take_the_tf_road_with_their_file_names(examples: Path) -> None:
    result = _python(WINDOWS, examples)
    # two Keras epochs are the loader's two epochs, whole
    assert result == {"shape": [4, 3], "dtype": "string", "epochs": 2, "loader_epoch": 2}


IMPORTS = r'''
import json
import numpy as np
import shardfeed.keras
from shardfeed.keras import adapt
from shardfeed.torch import adapt as torch_adapt
from shardfeed.tf import dataset
import shardfeed.jax
import shardfeed

assert shardfeed.keras.adapt is adapt and shardfeed.tf.dataset is dataset
loader = shardfeed.Loader(shardfeed.Dataset("out/"), batch_size=4, seed=0,
                          transform=shardfeed.presets.train(size=32))
x, y = adapt(loader)[0]          # no names: the image and the label
batch = next(iter(torch_adapt(shardfeed.Loader(shardfeed.Dataset("out/"), batch_size=4, seed=0,
                                               transform=shardfeed.presets.train(size=32)))))
np.testing.assert_array_equal(x, batch["image"].numpy())
np.testing.assert_array_equal(y, batch["image/class/label"].numpy())
try:
    adapt(shardfeed.Loader(shardfeed.Dataset("big/"), batch_size=2,
                           transform=shardfeed.presets.train(size=32)))
    message = ""
except ValueError as error:
    message = str(error)
print(json.dumps({"x": list(x.shape), "y": list(y.shape), "message": message}))
'''


def test_the_adapters_import_as_modules_and_adapt_needs_no_names(examples: Path) -> None:
    result = _python(IMPORTS, examples, backend="torch")
    assert result["x"] == [4, 32, 32, 3] and result["y"] == [4]
    # a dataset without labels: told which names were looked for and how to name them
    message = str(result["message"])
    assert "image/class/label" in message and "targets=" in message
