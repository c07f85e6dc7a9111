"""Keras 3 input (shardfeed.keras): model.fit / evaluate / predict on the loader's stream, the
same batches on every backend, and a fit killed mid-epoch that resumes the identical stream.

In this process Keras runs on the torch backend; the other backends (and the kill) run in
subprocesses, since Keras picks its backend once, at its first import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")

from pipeline_helpers import open_dataset, train_transform

from shardfeed.errors import StateError
from shardfeed.loaders import keras as sf_keras
from shardfeed.pipeline import Loader
from shardfeed.transforms import presets

HELPERS = Path(__file__).resolve().parents[1] / "pipeline"

# fits a model whose Recorder layer writes the "index" of every batch it trains on
DRIVER = r'''
import json, os, sys
sys.path.insert(0, os.environ["HELPERS"])
import numpy as np
import keras
from keras import ops
from pipeline_helpers import open_dataset, train_transform
import shardfeed
from shardfeed.pipeline import Loader

folder, out, mode, directory, kill_at = sys.argv[1:6]
kill_at_commit = int(os.environ.get("KILL_AT_COMMIT", "0"))
if kill_at_commit:  # killed while saving: the weights written, the state not yet renamed
    commits, replace = [0], os.replace
    def killing_replace(source, target, **kwargs):
        if str(target).endswith("loader_state.json"):
            commits[0] += 1
            if commits[0] == kill_at_commit:
                os._exit(3)
        return replace(source, target, **kwargs)
    os.replace = killing_replace
loader = Loader(open_dataset(folder), batch_size=4, seed=3, transform=train_transform(16),
                num_threads=int(os.environ.get("THREADS", "2")), drop_last=True)
data = shardfeed.keras.adapt(loader, inputs=("image", "index"), targets="image/class/label")
val = shardfeed.keras.adapt(
    Loader.for_eval(open_dataset(folder), batch_size=8, transform=shardfeed.presets.eval(size=16)),
    inputs=("image", "index"), targets="image/class/label")
training = [True]

class Recorder(keras.layers.Layer):
    def call(self, index):
        if training[0] and not keras.backend.is_keras_tensor(index):
            try:
                seen = np.asarray(ops.convert_to_numpy(index)).tolist()
            except Exception:  # a symbolic tensor while Keras builds the model
                seen = None
            if seen is not None:
                with open(out, "a") as fh:
                    fh.write(json.dumps(seen) + "\n")
        return ops.expand_dims(ops.cast(index, "float32"), -1) * 0.0

class Control(keras.callbacks.Callback):
    steps = 0
    def on_test_begin(self, logs=None): training[0] = False
    def on_test_end(self, logs=None): training[0] = True
    def on_train_batch_end(self, batch, logs=None):
        Control.steps += 1
        if Control.steps == int(kill_at):
            os._exit(3)

keras.utils.set_random_seed(0)  # the same initial weights in every run
image = keras.Input((16, 16, 3), name="image")
index = keras.Input((), dtype="int64", name="index")
x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(image))
model = keras.Model([image, index], keras.layers.Dense(5)(x) + Recorder()(index))
model.compile(keras.optimizers.SGD(0.01),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True), run_eagerly=True)
checkpoint = shardfeed.keras.LoaderCheckpoint(data, directory, save_every_steps=2)
options = dict(epochs=3, validation_data=val, verbose=0)
if mode == "resume":
    checkpoint.fit_resumed(model, callbacks=[Control()], **options)
else:
    model.fit(data, callbacks=[checkpoint, Control()], **options)
np.savez(out + ".weights.npz", *[np.asarray(w) for w in model.get_weights()])
'''


def _fit(tmp_path: Path, folder: Path, backend: str, name: str, *, mode: str = "fit",
         directory: Path | None = None, kill_at: int = 0, kill_at_commit: int = 0,
         threads: int = 2) -> tuple[int, list[list[int]]]:
    """Run the driver; (exit code, the index batches the model trained on)."""
    driver = tmp_path / "fit_driver.py"
    driver.write_text(DRIVER)
    out = tmp_path / f"{name}.jsonl"
    env = {**os.environ, "KERAS_BACKEND": backend, "HELPERS": str(HELPERS),
           "THREADS": str(threads), "TF_CPP_MIN_LOG_LEVEL": "3",
           "KILL_AT_COMMIT": str(kill_at_commit)}
    result = subprocess.run(
        [sys.executable, str(driver), str(folder), str(out), mode,
         str(directory or tmp_path / f"{name}-ckpt"), str(kill_at)],
        env=env, capture_output=True, text=True, timeout=170, check=False)
    assert result.returncode in (0, 3), result.stderr[-3000:]
    seen = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return result.returncode, seen


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory: pytest.TempPathFactory, adapter_folder: Path) -> Path:
    """The folder of an uninterrupted fit on the torch backend."""
    folder = tmp_path_factory.mktemp("whole")
    _fit(folder, adapter_folder, "torch", "whole")
    return folder


@pytest.fixture(scope="module")
def whole(whole_run: Path) -> list[list[int]]:
    """The batches of an uninterrupted fit on the torch backend."""
    return [json.loads(line) for line in (whole_run / "whole.jsonl").read_text().splitlines()]


def _weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[name] for name in sorted(saved.files, key=lambda n: int(n.split("_")[1]))]


def test_fit_killed_mid_epoch_resumes_the_identical_stream(
    tmp_path: Path, adapter_folder: Path, whole: list[list[int]],
) -> None:
    # 30 records, batch 4, drop_last: 7 steps an epoch, 3 epochs
    assert len(whole) == 21
    epochs = [sorted(i for b in whole[k * 7:(k + 1) * 7] for i in b) for k in range(3)]
    assert all(len(set(e)) == 28 for e in epochs) and epochs[0] != [b for b in whole[7:14]]
    directory = tmp_path / "killed-ckpt"
    # killed after step 10 (epoch 1, step 3): the last checkpoint is epoch 1, step 2
    code, before = _fit(tmp_path, adapter_folder, "torch", "killed", directory=directory,
                        kill_at=10)
    assert code == 3 and len(before) == 10
    saved = json.loads((directory / "loader_state.json").read_text())
    assert (saved["epoch"], saved["step"]) == (1, 2)
    assert (directory / saved["weights"]).exists()
    # which records steps 5 and 9 held, from the checkpoint's folder alone (it records the
    # batch size and ranks): what the model trained on
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    for step in (5, 9):
        which = subprocess.run(
            [sys.executable, "-m", "shardfeed", "which", str(adapter_folder), "--state",
             str(directory), "--step", str(step), "--json"],
            capture_output=True, text=True, env=env, timeout=120, check=False)
        assert which.returncode == 0, which.stderr
        held = [s["records"][0]["features"]["index"][0]
                for s in json.loads(which.stdout)["samples"]]
        assert held == before[step]
    # resumed on another thread count: the rest of epoch 1, then epoch 2
    _, after = _fit(tmp_path, adapter_folder, "torch", "resumed", mode="resume",
                    directory=directory, threads=1)
    assert before[:9] + after == whole


def test_a_kill_between_weights_and_state_keeps_the_previous_checkpoint(
    tmp_path: Path, adapter_folder: Path, whole_run: Path, whole: list[list[int]],
) -> None:
    directory = tmp_path / "torn-ckpt"
    # saves at steps 2, 4, 6 and the end of epoch 0 (step 7); killed in the 4th save, after
    # its weights were written and before its state was: the checkpoint of step 6 stands
    code, before = _fit(tmp_path, adapter_folder, "torch", "torn", directory=directory,
                        kill_at_commit=4)
    assert code == 3 and before == whole[:7]
    saved = json.loads((directory / "loader_state.json").read_text())
    assert (saved["epoch"], saved["step"]) == (0, 6)
    _, after = _fit(tmp_path, adapter_folder, "torch", "torn-resumed", mode="resume",
                    directory=directory)
    assert after == whole[6:]  # step 7 again, then epochs 1 and 2: no batch twice
    resumed = _weights(tmp_path / "torn-resumed.jsonl.weights.npz")
    uninterrupted = _weights(whole_run / "whole.jsonl.weights.npz")
    assert all(np.array_equal(a, b) for a, b in zip(resumed, uninterrupted, strict=True))
    # the weights the torn save wrote are not kept once a later save committed
    assert [p.name for p in directory.glob("*.weights.h5")] == [saved_name(directory)]


def saved_name(directory: Path) -> str:
    return str(json.loads((directory / "loader_state.json").read_text())["weights"])


def test_the_jax_backend_trains_on_the_same_batches(
    tmp_path: Path, adapter_folder: Path, whole: list[list[int]],
) -> None:
    pytest.importorskip("jax")
    _, on_jax = _fit(tmp_path, adapter_folder, "jax", "jax")
    assert len(whole) == 21 and on_jax == whole


@pytest.mark.tensorflow
def test_the_tensorflow_backend_trains_on_the_same_batches(
    tmp_path: Path, adapter_folder: Path, whole: list[list[int]],
) -> None:
    pytest.importorskip("tensorflow")
    _, on_tf = _fit(tmp_path, adapter_folder, "tensorflow", "tf")
    assert len(whole) == 21 and on_tf == whole


# -- in this process (torch backend) ------------------------------------------------------------


def _loader(folder: Path, **options: Any) -> Loader:
    return Loader(open_dataset(folder), batch_size=8, seed=1, transform=train_transform(),
                  num_threads=2, **options)


def test_batches_by_feature_names_multi_input_and_output(adapter_folder: Path) -> None:
    with _loader(adapter_folder) as loader:
        data = sf_keras.adapt(loader, inputs={"pixels": "image", "ids": "index"},
                              targets=("labels", "image/class/label"), sample_weights="timestamp")
        assert len(data) == 4
        x, y, weights = data[0]
        assert sorted(x) == ["ids", "pixels"] and x["pixels"].shape == (8, 32, 32, 3)
        assert y[0].shape == (8, 3) and y[0].dtype == np.float32 and y[1].shape == (8,)
        assert weights.shape == (8,)
    with _loader(adapter_folder) as loader:
        assert isinstance(sf_keras.adapt(loader, inputs="image")[0], tuple)
        with pytest.raises(ValueError, match="'labelz'"):
            sf_keras.adapt(loader, inputs="image", targets="labelz")


def test_fit_evaluate_predict_follow_the_loaders_order(adapter_folder: Path) -> None:
    with _loader(adapter_folder, drop_last=True) as reference:
        expected = [b["index"].tolist() for b in reference] + [b["index"].tolist()
                                                               for b in reference]
    seen: list[list[int]] = []
    with _loader(adapter_folder, drop_last=True) as loader:
        data = sf_keras.adapt(loader, inputs="image", targets="image/class/label")
        original = data._structure

        def spy(batch: Any) -> Any:
            seen.append(batch["index"].tolist())
            return original(batch)

        data._structure = spy  # type: ignore[method-assign]
        model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
                                  keras.layers.Flatten(), keras.layers.Dense(5)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(data, epochs=2, verbose=0, shuffle=True,  # Keras's: no effect
                            callbacks=[sf_keras.LoaderCheckpoint(data, None)])
        assert len(history.history["loss"]) == 2
        # Keras reads the first batch ahead to build the model: it is served again, not lost
        assert seen[0] == seen[1] and seen[1:] == expected
        assert (loader.state()["epoch"], loader.state()["consumed"]) == (2, 0)
    with Loader.for_eval(open_dataset(adapter_folder), batch_size=8,
                         transform=presets.eval(size=32)) as evaluation:
        val = sf_keras.adapt(evaluation, inputs="image", targets="image/class/label")
        assert len(val) == 4  # the last partial batch is kept
        assert np.isfinite(model.evaluate(val, verbose=0))
        assert model.predict(sf_keras.adapt(evaluation, inputs="image"), verbose=0).shape == (30, 5)


def test_restore_puts_back_the_optimizers_state_into_a_fresh_model(
    adapter_folder: Path, tmp_path: Path,
) -> None:
    # a restarted job compiles a new model: its Adam has no moments yet, and Keras skips
    # loading saved optimizer variables into an optimizer that is not built
    def compiled() -> Any:
        model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
                                  keras.layers.Flatten(), keras.layers.Dense(5)])
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    with _loader(adapter_folder) as loader:
        data = sf_keras.adapt(loader, inputs="image", targets="image/class/label")
        trained = compiled()
        trained.fit(data, epochs=1, verbose=0,
                    callbacks=[sf_keras.LoaderCheckpoint(data, tmp_path / "ckpt")])
    with _loader(adapter_folder) as loader:
        data = sf_keras.adapt(loader, inputs="image", targets="image/class/label")
        fresh = compiled()
        assert sf_keras.LoaderCheckpoint(data, tmp_path / "ckpt").restore(fresh) == (1, 0)
    saved = [np.asarray(v) for v in trained.optimizer.variables]
    restored = [np.asarray(v) for v in fresh.optimizer.variables]
    assert int(fresh.optimizer.iterations) == 4  # 30 records, batch 8
    assert len(restored) == len(saved) > 2  # the step counter, rate and Adam's moments
    assert all(np.array_equal(a, b) for a, b in zip(saved, restored, strict=True))


def test_a_plain_fit_after_a_mid_epoch_restore_is_refused_with_the_recipe(
    adapter_folder: Path, tmp_path: Path,
) -> None:
    # 30 records, batch 8: 4 steps an epoch; stopped after step 2 of epoch 0
    class Stop(Exception):
        pass

    class StopAfterStep2(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 1:
                raise Stop

    class Count(keras.callbacks.Callback):
        steps = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            Count.steps += 1

    def compiled() -> Any:
        model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
                                  keras.layers.Flatten(), keras.layers.Dense(5)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    with _loader(adapter_folder) as loader:
        data = sf_keras.adapt(loader, inputs="image", targets="image/class/label")
        checkpoint = sf_keras.LoaderCheckpoint(data, tmp_path / "ckpt", save_every_steps=2)
        with pytest.raises(Stop):
            compiled().fit(data, epochs=2, callbacks=[checkpoint, StopAfterStep2()], verbose=0)
    with _loader(adapter_folder) as loader:
        data = sf_keras.adapt(loader, inputs="image", targets="image/class/label")
        checkpoint = sf_keras.LoaderCheckpoint(data, tmp_path / "ckpt", save_every_steps=2)
        model = compiled()
        assert checkpoint.restore(model) == (0, 2)
        # Keras's own recipe would train 4 steps as the rest of epoch 0: refused, with the fix
        with pytest.raises(StateError, match=r"step 2 of epoch 0.*fit_resumed.*"
                                             r"steps_per_epoch=2"):
            model.fit(data, initial_epoch=0, epochs=2, callbacks=[checkpoint, Count()],
                      verbose=0)
        assert Count.steps == 0
        checkpoint.fit_resumed(model, epochs=2, callbacks=[Count()], verbose=0)
        assert Count.steps == 2 + 4  # the rest of epoch 0, then epoch 1
        assert (loader.state()["epoch"], loader.state()["consumed"]) == (2, 0)


def test_the_inputs_figures_land_in_kerass_logs(adapter_folder: Path, tmp_path: Path) -> None:
    """LoaderStatsLog puts the window's figures in the logs of every epoch, which Keras's
    History keeps and its TensorBoard callback writes as scalars; and says the verdict."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with _loader(adapter_folder, drop_last=True) as loader:
        data = sf_keras.adapt(loader, inputs="image", targets="image/class/label")
        model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
                                  keras.layers.Flatten(), keras.layers.Dense(5)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        log = sf_keras.LoaderStatsLog(data, every_steps=2)  # steps' figures do not eat the epoch's
        board = keras.callbacks.TensorBoard(str(tmp_path / "runs"))
        history = model.fit(data, epochs=2, verbose=0, callbacks=[log, board])
        events = EventAccumulator(str(tmp_path / "runs" / "train"))
        events.Reload()
        written = set(events.Tags()["scalars"]) | set(events.Tags()["tensors"])
        assert {"epoch_input_wait_share", "epoch_input_decode_share"} <= written, written
        seen = history.history
        assert len(seen["input_wait_share"]) == 2
        assert all(0 <= v <= 1 for v in seen["input_wait_share"])
        assert all(v > 0 for v in seen["input_samples_per_s"])
        assert all(v > 0 for v in seen["input_wait_share"]) or all(
            v > 0 for v in seen["input_threads_busy"])
        assert all(v > 0 for v in seen["input_decode_share"])
        assert log.verdict and data.stats().batches_total > 0
    with pytest.raises(TypeError, match="LoaderStatsLog needs"):
        sf_keras.LoaderStatsLog(object())


def test_torch_writes_the_figures_to_a_summary_writer(adapter_folder: Path,
                                                      tmp_path: Path) -> None:
    torch_adapter = pytest.importorskip("shardfeed.torch")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "runs"))
    with _loader(adapter_folder, drop_last=True) as loader:
        batches = torch_adapter.adapt(loader)
        for step, _ in enumerate(batches):
            if step % 2 == 0:  # step 0 too: a pass's first batch alone is kept for the next
                stats = torch_adapter.log_stats(writer, batches, step)
        writer.close()
        assert stats.verdict
    events = EventAccumulator(str(tmp_path / "runs"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"input/wait_share", "input/samples_per_s", "input/decode_share",
            "input/threads_busy"} <= tags, tags
    logged = [e.step for e in events.Scalars("input/wait_share")]
    assert logged == list(range(2, step + 1, 2))  # step 0's batch is in step 2's point
    assert events.Scalars("input/wait_share")[0].value > 0  # the pass's set-up wait is there
