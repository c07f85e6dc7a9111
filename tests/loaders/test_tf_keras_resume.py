"""The Keras resume recipe over ``shardfeed.tf.dataset``, walked as a user walks it: a
``tf.train.Checkpoint`` of the model, its optimizer and ``shardfeed.tf.LoaderState``, saved
every few steps by a callback; the process killed mid-epoch; a fresh process that restores
the checkpoint and calls ``model.fit(ds, initial_epoch=e, epochs=E)``, as Keras documents.
The resumed run must train exactly the batches the uninterrupted run trains after the
checkpoint, and a plain ``fit`` must not tell the user its input ran out of data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from pipeline_helpers import open_dataset, train_transform

from shardfeed.pipeline import Loader

pytestmark = pytest.mark.tensorflow
pytest.importorskip("tensorflow")
pytest.importorskip("keras")

HELPERS = Path(__file__).resolve().parents[1] / "pipeline"

DRIVER = r'''
import json, os, sys
os.environ["KERAS_BACKEND"] = "tensorflow"
sys.path.insert(0, os.environ["HELPERS"])
import numpy as np
import tensorflow as tf
import keras
from pipeline_helpers import open_dataset, train_transform
import shardfeed
from shardfeed.pipeline import Loader

folder, out, directory, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
loader = Loader(open_dataset(folder), batch_size=4, seed=3, transform=train_transform(16),
                num_threads=2, drop_last=True)
ds = shardfeed.tf.dataset(loader, features=["image", "index", "image/class/label"]).map(
    lambda b: ((b["image"], b["index"]), b["image/class/label"]))

class Recorder(keras.layers.Layer):
    def call(self, index):
        def write(values):
            with open(out, "a") as fh:
                fh.write(json.dumps(values.tolist()) + "\n")
            return np.float32(0)
        done = tf.reshape(tf.numpy_function(write, [index], tf.float32, stateful=True), [])
        return tf.zeros_like(tf.cast(index, tf.float32))[:, None] + done

image = keras.Input((16, 16, 3), name="image")
index = keras.Input((), dtype="int64", name="index")
x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(image))
model = keras.Model([image, index], keras.layers.Dense(5)(x) + Recorder()(index))
optimizer = keras.optimizers.SGD(0.01)
model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                 data=shardfeed.tf.LoaderState(loader))
manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=2)

class SaveAndDie(keras.callbacks.Callback):
    steps = 0
    def on_train_batch_end(self, batch, logs=None):
        SaveAndDie.steps += 1
        if SaveAndDie.steps % 2 == 0:
            manager.save()
        if SaveAndDie.steps == kill_at:
            os._exit(3)

initial_epoch = 0
if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint)
    initial_epoch = loader.epoch
model.fit(ds, initial_epoch=initial_epoch, epochs=3, shuffle=False,
          callbacks=[SaveAndDie()], verbose=0)
print(json.dumps({"initial_epoch": initial_epoch, "steps": SaveAndDie.steps}))
'''


def _run(tmp_path: Path, folder: Path, name: str, directory: Path, kill_at: int = 0
         ) -> tuple[subprocess.CompletedProcess[str], list[list[int]]]:
    driver = tmp_path / "tf_resume_driver.py"
    driver.write_text(DRIVER)
    out = tmp_path / f"{name}.jsonl"
    env = {**os.environ, "HELPERS": str(HELPERS), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, str(driver), str(folder), str(out), str(directory),
                           str(kill_at)], env=env, capture_output=True, text=True, timeout=170,
                          check=False)
    assert done.returncode in (0, 3), done.stderr[-3000:]
    seen = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return done, seen


def test_keras_initial_epoch_resume_trains_every_batch_once(tmp_path: Path,
                                                             adapter_folder: Path) -> None:
    # 30 records, batch 4, drop_last: 7 steps an epoch, 3 epochs; the uninterrupted run
    # trains the loader's own stream (the killed run checks its first 11 batches)
    with Loader(open_dataset(adapter_folder), batch_size=4, seed=3,
                transform=train_transform(16), num_threads=2, drop_last=True) as loader:
        whole = [b["index"].tolist() for _ in range(3) for b in loader]
    assert len(whole) == 21
    epochs = [sorted(i for b in whole[k * 7:(k + 1) * 7] for i in b) for k in range(3)]
    assert all(len(set(e)) == 28 for e in epochs)
    directory = tmp_path / "killed-ckpt"
    # killed after step 11 (epoch 1, step 4): the last checkpoint is after step 10
    killed, before = _run(tmp_path, adapter_folder, "killed", directory, kill_at=11)
    assert killed.returncode == 3 and before == whole[:11]
    assert "ran out of data" not in killed.stderr  # Keras knew epoch 0's length
    resumed, after = _run(tmp_path, adapter_folder, "resumed", directory)
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["initial_epoch"] == 1
    # the rest of epoch 1 (4 batches), then epoch 2: every batch after the checkpoint, once
    assert after == whole[10:]
    # Keras ends the resumed epoch where the loader's epoch ends (its one warning says so)
    assert resumed.stderr.count("ran out of data") == 1
