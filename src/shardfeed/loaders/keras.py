"""Keras 3 input from a Loader, on the TensorFlow, JAX and torch backends.

::

    train = shardfeed.keras.adapt(train_loader, inputs="image", targets="image/class/label")
    val = shardfeed.keras.adapt(eval_loader, inputs="image", targets="image/class/label")
    model.fit(train, validation_data=val, epochs=3,
              callbacks=[shardfeed.keras.LoaderCheckpoint(train, "ckpt/")])

:func:`adapt` gives a ``keras.utils.PyDataset`` of ``(x, y)`` or ``(x, y, sample_weight)``
tuples: ``len`` is the loader's batches an epoch (Keras's ``steps_per_epoch``). Features are
picked by name: ``inputs="frames"`` (one input), ``("image", "mask")`` (inputs in order) or
``{"pixels": "image"}`` (model input name -> feature); ``targets`` likewise. The arrays are
the loader's own NumPy batches; Keras makes the one copy into its backend's tensor.

The order is the loader's: Keras's own ``shuffle`` and the index it asks for are ignored, each
request being the stream's next batch (so ``fit(shuffle=True)``, Keras's default, changes
nothing). Keras reads a batch or two ahead to build the model or learn the input spec: those
reads give the stream's coming batches and are then served again, never skipped.

Exact resume: :class:`LoaderCheckpoint` saves the model's weights and the loader's state
after the last batch the model trained on (not after the batches Keras read ahead), and
:meth:`LoaderCheckpoint.restore` puts both back. Keras counts epochs of ``len`` steps from
where it starts: after a resume in the middle of an epoch, ``fit_resumed`` finishes that
epoch's remaining steps first, so epochs stay the loader's.

Determinism: the loader's, the same on every backend. State: the loader's. Memory: the
loader's bound plus the batches Keras holds ahead (its prefetch).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import keras

from shardfeed.errors import StateError
from shardfeed.loaders.numpy import AdaptedLoader
from shardfeed.pipeline.stage_stats import scalars

Names = str | Sequence[str] | Mapping[str, str] | None

# Keras functions that read a batch ahead without training on it
_LOOK_AHEAD = frozenset({"get_tf_dataset", "_maybe_symbolic_build", "_symbolic_build"})


def _pick(batch: Mapping[str, Any], names: Names) -> Any:
    if names is None:
        return None
    if isinstance(names, str):
        return batch[names]
    if isinstance(names, Mapping):
        return {key: batch[feature] for key, feature in names.items()}
    return tuple(batch[name] for name in names)


def _flat(names: Names) -> list[str]:
    if names is None:
        return []
    if isinstance(names, str):
        return [names]
    if isinstance(names, Mapping):
        return list(names.values())
    return list(names)


def _looking_ahead() -> bool:
    """Whether Keras calls from one of its read-ahead functions (a few frames up)."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            return False
        if frame.f_code.co_name in _LOOK_AHEAD:
            return True
        frame = frame.f_back
    return False


class LoaderDataset(keras.utils.PyDataset):  # type: ignore[misc]
    """The loader's stream as a ``keras.utils.PyDataset`` (see the module docstring)."""

    def __init__(self, loader: Any, *, inputs: Names, targets: Names = None,
                 sample_weights: str | None = None) -> None:
        super().__init__(workers=1, use_multiprocessing=False)
        self.loader = loader.loader if isinstance(loader, AdaptedLoader) else loader
        self.inputs, self.targets, self.sample_weights = inputs, targets, sample_weights
        self._iterator: Any = None
        # batches read ahead by Keras (with the state after each), served again next
        self._ahead: list[tuple[Any, dict[str, Any]]] = []
        self.produced = 0  # batches taken from the loader's stream (read-ahead excluded)
        self.history: dict[int, dict[str, Any]] = {0: self.loader.state()}

    def __len__(self) -> int:
        return len(self.loader)

    def stats(self, window: Any = None) -> Any:
        """The loader's :meth:`~shardfeed.pipeline.Loader.stats`."""
        return self.loader.stats(window)

    def stats_window(self) -> Any:
        """The loader's :meth:`~shardfeed.pipeline.Loader.stats_window`."""
        return self.loader.stats_window()

    def _next(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self.loader)
        try:
            return next(self._iterator)
        except StopIteration:  # the loader's epoch ended: its next epoch goes on
            self._iterator = iter(self.loader)
            return next(self._iterator)

    def _structure(self, batch: Mapping[str, Any]) -> tuple[Any, ...]:
        x = _pick(batch, self.inputs)
        if self.targets is None:
            return (x,)
        y = _pick(batch, self.targets)
        if self.sample_weights is None:
            return (x, y)
        return (x, y, batch[self.sample_weights])

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        del index  # the order is the loader's
        if _looking_ahead():
            if len(self._ahead) < 4:  # a read ahead: served again as the coming batch
                batch = self._next()
                self._ahead.append((batch, self.loader.state()))
            return self._structure(self._ahead[-1][0])
        batch, state = self._ahead.pop(0) if self._ahead else (self._next(), None)
        self.produced += 1
        self.history[self.produced] = state if state is not None else self.loader.state()
        return self._structure(batch)

    # -- state ---------------------------------------------------------------------------------

    def state_after(self, batches: int) -> dict[str, Any]:
        """The loader's state after ``batches`` batches of this stream (from its start or its
        last restore), if Keras has read no further than those plus a few; drops older ones."""
        for key in [k for k in self.history if k < batches]:
            del self.history[key]
        if batches not in self.history:
            raise RuntimeError(
                f"the loader's state after batch {batches} of the stream is not known (only "
                f"{sorted(self.history)}): save from LoaderCheckpoint's hooks"
            )
        return self.history[batches]

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue the stream from ``state`` (a loader state); drops batches read ahead."""
        self._iterator = None  # the loader stops its pass at the next iter()
        self._ahead = []
        self.loader.restore(state)
        self.produced = 0
        self.history = {0: self.loader.state()}

    def rewind(self, batches: int) -> None:
        """Put the stream back to just after ``batches`` batches (those Keras took beyond are
        made again): call when training stops, so that batches read ahead are not lost."""
        if batches != self.produced or self._ahead:
            self.restore(self.state_after(batches))


# the label a batch carries, by the names packers give it (the first found is the target)
LABEL_NAMES = ("label", "labels", "image/class/label", "mask")


def _default_names(known: set[str] | None) -> tuple[str, str]:
    """``(inputs, targets)`` when none are named: the image, and the one label found."""
    if known is None:
        return "image", "image/class/label"
    found = [name for name in LABEL_NAMES if name in known]
    if "image" not in known or not found:
        raise ValueError(
            f"adapt() without inputs= feeds 'image' to the model and one of {list(LABEL_NAMES)} "
            f"to the loss, and the batches have {sorted(known)}: name them, e.g. "
            "adapt(loader, inputs='image', targets='image/class/label')"
        )
    return "image", found[0]


def adapt(loader: Any, *, inputs: Names = None, targets: Names = None,
          sample_weights: str | None = None) -> LoaderDataset:
    """A ``keras.utils.PyDataset`` of ``loader``'s batches as ``(x, y[, sample_weight])``.

    Args:
        loader: a :class:`shardfeed.Loader` (or an adapter of one).
        inputs: the feature(s) the model takes: a name, names in input order, or a mapping
            of model input name to feature. None (with ``targets`` None too): ``"image"``
            as x and the batch's label as y (the first of ``label``, ``labels``,
            ``image/class/label``, ``mask`` it has).
        targets: the feature(s) the loss compares with (same forms), or None (``predict``).
        sample_weights: a feature of per-sample weights, or None.

    Raises:
        ValueError: a name is not a feature of the batches (or, with no names given, the
            batches have no image or no label).
        TypeError: ``loader`` is not a Loader.
    """
    inner = loader.loader if isinstance(loader, AdaptedLoader) else loader
    if not callable(getattr(inner, "state", None)) or not callable(getattr(inner, "restore",
                                                                           None)):
        raise TypeError(f"adapt() needs a shardfeed.Loader, got {type(loader).__name__}")
    layout = inner.batch_layout()[0] if hasattr(inner, "batch_layout") \
        and not inner.batch_stages else None
    known = {f.name for f in layout.fields} if layout is not None else None
    if inputs is None and targets is None:
        inputs, targets = _default_names(known)
    names = [*_flat(inputs), *_flat(targets), *([sample_weights] if sample_weights else [])]
    if not _flat(inputs):
        raise ValueError("inputs must name at least one feature, e.g. inputs='image'")
    if known is not None:
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"features {missing} are not in the loader's batches "
                             f"{sorted(known)}: pick inputs/targets among those")
    return LoaderDataset(inner, inputs=inputs, targets=targets, sample_weights=sample_weights)


def _build_optimizer(model: Any) -> None:
    """Create the optimizer's variables (Adam's moments, ...) of a freshly compiled model:
    Keras loads saved optimizer variables only into a built optimizer, and would otherwise
    skip them with a warning, resuming with reset moments."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built and model.built:
        optimizer.build(model.trainable_variables)


_STATE_FILE = "loader_state.json"
_WEIGHTS_SUFFIX = ".weights.h5"
_WEIGHTS_FILE = "model.weights.h5"  # the weights of a checkpoint that names none


def _committed(directory: Path) -> dict[str, Any]:
    """The checkpoint committed in ``directory`` (``{}`` when there is none)."""
    path = directory / _STATE_FILE
    if not path.exists():
        return {}
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def _sync(path: Path) -> None:
    """Flush a written file (or a folder's entries) to the disk before the commit."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class LoaderCheckpoint(keras.callbacks.Callback):  # type: ignore[misc]
    """Save the model's weights and the loader's state together, for exact resume.

    Saved every ``save_every_steps`` training steps (if given) and at each epoch's end, in
    ``directory``: the weights in a file of their own (``model.000007.weights.h5``), then
    ``loader_state.json`` (the loader's state after the last batch the model trained on,
    with Keras's epoch and step, and the name of that weights file), written to a temporary
    name and renamed. That rename is the commit of the pair: a job killed at any point of a
    save keeps the previous checkpoint whole, weights and stream position together; weights
    files no checkpoint names are removed by the next save. When training stops, batches
    Keras read ahead are given back to the stream.

    ``directory=None`` saves nothing and only keeps the stream exact across ``fit`` calls.
    """

    def __init__(self, data: LoaderDataset, directory: str | os.PathLike[str] | None, *,
                 save_every_steps: int | None = None, save_weights: bool = True) -> None:
        super().__init__()
        if not isinstance(data, LoaderDataset):
            raise TypeError("LoaderCheckpoint needs the data of shardfeed.keras.adapt(loader)")
        if save_every_steps is not None and (isinstance(save_every_steps, bool)
                                             or save_every_steps < 1):
            raise ValueError(f"save_every_steps must be an int >= 1 or None, got "
                             f"{save_every_steps!r}")
        self.data = data
        self.directory = Path(directory) if directory is not None else None
        self.save_every_steps = save_every_steps
        self.save_weights = save_weights
        self._epoch_start = 0  # batches of the stream before this epoch
        self._taken = 0  # batches the model trained on since the stream's start/restore
        self._epoch = 0
        self._step_offset = self._next_offset = 0  # steps of the epoch done before a resume
        self._resumed: tuple[int, int] | None = None  # (epoch, step) restored mid-epoch

    # -- Keras hooks ---------------------------------------------------------------------------

    def on_train_begin(self, logs: Any = None) -> None:
        self._taken = self.data.produced  # batches Keras read ahead are not counted there
        self._check_resumed_steps()

    def _check_resumed_steps(self) -> None:
        """A fit right after a mid-epoch restore must be of the epoch's remaining steps:
        Keras counts a whole epoch from where it starts, so a plain ``fit(initial_epoch=e)``
        would train the next epoch's first batches as this one's and every epoch after it
        off by as many (found by the steps Keras says it will take, ``params["steps"]``)."""
        if self._resumed is None:
            return
        epoch, step = self._resumed
        left = len(self.data) - step
        steps = (self.params or {}).get("steps")
        if steps is not None and steps != left:
            raise StateError(
                f"the loader was restored at step {step} of epoch {epoch} ({len(self.data)} "
                f"steps an epoch) and this fit would take {steps} steps as that epoch: Keras "
                f"counts a whole epoch from the resume point, so epochs would no longer be the "
                f"loader's. Resume with checkpoint.fit_resumed(model, epochs=...), or first "
                f"model.fit(data, initial_epoch={epoch}, epochs={epoch + 1}, "
                f"steps_per_epoch={left}, callbacks=[checkpoint]) and then the epochs left"
            )

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch, self._epoch_start = epoch, self._taken
        self._step_offset, self._next_offset = self._next_offset, 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._taken = self._epoch_start + batch + 1
        step = self._step_offset + batch + 1
        if self.save_every_steps and step % self.save_every_steps == 0:
            self.save(step=step)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._resumed = None  # the interrupted epoch is done
        self.save(step=0, epoch_done=True)

    def on_train_end(self, logs: Any = None) -> None:
        self.data.rewind(self._taken)  # batches read ahead and not trained on go back
        self._taken = self.data.produced

    # -- files ---------------------------------------------------------------------------------

    def save(self, *, step: int, epoch_done: bool = False) -> None:
        """Write the checkpoint now (the state after the last batch trained on)."""
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        serial = _committed(self.directory).get("serial", 0) + 1
        record: dict[str, Any] = {
            "loader": self.data.state_after(self._taken),
            "epoch": self._epoch + 1 if epoch_done else self._epoch,
            "step": step,
            "serial": serial,
        }
        if self.save_weights and self.model is not None:
            weights = f"model.{serial:06d}{_WEIGHTS_SUFFIX}"
            self.model.save_weights(self.directory / weights)
            _sync(self.directory / weights)
            record["weights"] = weights
        temporary = self.directory / f"{_STATE_FILE}.tmp"
        temporary.write_text(json.dumps(record, sort_keys=True))
        _sync(temporary)
        os.replace(temporary, self.directory / _STATE_FILE)  # the commit of the pair
        _sync(self.directory)
        for old in self.directory.glob(f"model.*{_WEIGHTS_SUFFIX}"):
            if old.name != record.get("weights"):
                old.unlink(missing_ok=True)

    def restore(self, model: Any = None) -> tuple[int, int]:
        """Put back the loader's state (and ``model``'s weights, with its optimizer's state)
        from ``directory``.

        Returns ``(epoch, step)``: the Keras epoch to go on with (``initial_epoch``) and the
        steps of it already done; ``(0, 0)`` when there is no checkpoint yet.
        """
        if self.directory is None or not (self.directory / _STATE_FILE).exists():
            return 0, 0
        record = _committed(self.directory)
        if model is not None and self.save_weights:
            _build_optimizer(model)
            model.load_weights(self.directory / record.get("weights", _WEIGHTS_FILE))
        self.data.restore(record["loader"])
        self._taken = 0
        epoch, step = int(record["epoch"]), int(record["step"])
        self._resumed = (epoch, step) if step else None
        return epoch, step

    def fit_resumed(self, model: Any, *, epochs: int, **fit_options: Any) -> None:
        """``model.fit`` from the checkpoint: the weights and the stream are restored, the
        interrupted epoch's remaining steps are run, then the epochs left (``fit_options``
        go to each ``fit``; this callback is added)."""
        epoch, step = self.restore(model)
        callbacks = [*fit_options.pop("callbacks", []), self]
        if step and epoch < epochs:
            self._next_offset = step
            model.fit(self.data, initial_epoch=epoch, epochs=epoch + 1,
                      steps_per_epoch=len(self.data) - step, callbacks=callbacks, **fit_options)
            epoch += 1
        if epoch < epochs:
            model.fit(self.data, initial_epoch=epoch, epochs=epochs, callbacks=callbacks,
                      **fit_options)


class LoaderStatsLog(keras.callbacks.Callback):  # type: ignore[misc]
    """Where the input's time went, in Keras's logs: at each epoch's end (and every
    ``every_steps`` steps, where given) :meth:`Loader.stats` of the time since the last log
    is added to ``logs`` as ``input_wait_share`` (the share of the step's time spent waiting
    for data), ``input_samples_per_s``, ``input_threads_busy`` and ``input_<stage>_share``
    for each stage (read, decode, transform, assemble, storage). Put it before
    ``keras.callbacks.TensorBoard`` in ``callbacks``: TensorBoard then writes them as
    scalars (``epoch_input_wait_share``, ...), and ``fit``'s History keeps them. The verdict
    of the last window is :attr:`verdict`."""

    def __init__(self, data: Any, *, every_steps: int | None = None) -> None:
        super().__init__()
        loader = data.loader if isinstance(data, (LoaderDataset, AdaptedLoader)) else data
        if not callable(getattr(loader, "stats", None)):
            raise TypeError("LoaderStatsLog needs a shardfeed Loader or its keras.adapt data")
        if every_steps is not None and (isinstance(every_steps, bool) or every_steps < 1):
            raise ValueError(f"every_steps must be an int >= 1 or None, got {every_steps!r}")
        self.loader = loader
        self.every_steps = every_steps
        self.verdict = ""
        # its own windows (other readers do not shorten them): the epoch's, and the steps'
        self._epoch = loader.stats_window()
        self._steps = loader.stats_window()

    def _add(self, logs: dict[str, Any] | None, window: Any) -> None:
        stats = self.loader.stats(window)
        self.verdict = stats.verdict
        if logs is None or stats.window is None:
            return
        logs.update(scalars(stats.window, prefix="input_"))

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.every_steps is not None and (batch + 1) % self.every_steps == 0:
            self._add(logs, self._steps)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._add(logs, self._epoch)


__all__ = ["LoaderCheckpoint", "LoaderDataset", "LoaderStatsLog", "adapt"]
