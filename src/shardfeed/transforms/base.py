"""The transform contract, composition, and the output spec the loader batches with.

A transform takes one sample (the dict the Example codec decoded, later with ``"image"`` and
``"mask"`` arrays) and a generator keyed by ``(seed, epoch, position)``, and returns the
sample. Every random choice comes from that generator, so an output depends only on its key.

:class:`TransformBase` declares the whole contract, each member with an explicit default:

- ``__call__(sample, rng, /) -> sample`` (abstract); with ``accepts_out = True`` it also
  takes ``out=``, and the final ``"image"`` is written into ``out`` (a slot of the batch).
- ``bind(schema, *, root) -> transform``: called once by the Loader before use, so decode
  ops learn which feature holds the image and how it is stored. Default: the transform.
- ``output_spec(specs) -> specs | None``: how it changes the shape/dtype of
  ``"image"``/``"mask"``; the default, None, says "no spec" (the batch gets a copy instead
  of the write-into-batch fast path).
- ``draws_random``: False when the transform never draws from its generator (decode, center
  crop, normalisation, ...); it is then handed :data:`NO_RANDOMNESS` instead of a keyed
  generator (a few µs a sample saved); drawing from that raises. Default: True.
- ``decode_bytes``: the most memory one call holds while it decodes an image (the decode
  ops: ``max_pixels`` × the decode's peak bytes a pixel), counted once a thread by
  ``Loader.memory_budget()``. Default: None (it does not decode).

Anything else callable is wrapped once by :func:`shardfeed.transforms.wrap.adapt` (a
one-argument ``f(sample)`` becomes a ``FunctionTransform``; another object keeps the members
it defines, read once when wrapped), so the pipeline reads declared attributes.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

Sample = dict[str, Any]
"""One sample: feature name → value (NumPy arrays, bytes, lists of bytes)."""


@runtime_checkable
class Transform(Protocol):
    """``transform(sample, rng) -> sample``."""

    def __call__(self, sample: Sample, rng: np.random.Generator, /) -> Sample: ...


class ShapeKeysLike(Protocol):
    """The features that hold a raw image's height, width and channels."""

    @property
    def height_key(self) -> str | None: ...

    @property
    def width_key(self) -> str | None: ...

    @property
    def channels_key(self) -> str | None: ...


class ImageInfoLike(ShapeKeysLike, Protocol):
    """What decode ops read from ``shardfeed.format.schema.ImageInfo``."""

    @property
    def key(self) -> str: ...

    @property
    def encoding(self) -> str: ...


class SchemaLike(Protocol):
    """What transforms read from ``shardfeed.format.schema.Schema``."""

    @property
    def image(self) -> ImageInfoLike | None: ...

    @property
    def mask(self) -> ImageInfoLike | None: ...


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """Shape and dtype of one output array; ``None`` in ``shape`` means it varies by sample."""

    shape: tuple[int | None, ...]
    dtype: np.dtype[Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        for dim in self.shape:
            if dim is not None and (not isinstance(dim, int) or dim < 0):
                raise ValueError(f"ArraySpec shape dims must be ints >= 0 or None, got {self.shape}")

    @property
    def fixed(self) -> bool:
        """True when every dimension is known, so a batch array can be preallocated."""
        return all(dim is not None for dim in self.shape)


Specs = dict[str, ArraySpec]
"""Output specs by sample key (``"image"``, ``"mask"``)."""


class TransformBase(ABC):
    """The base of every transform: the whole contract declared, with explicit defaults.

    Subclasses implement ``__call__`` and override what they declare (see the module doc).
    """

    __slots__ = ()

    @property
    def accepts_out(self) -> bool:
        """True when ``__call__`` takes ``out=`` (a batch slot for the final image)."""
        return False

    @property
    def draws_random(self) -> bool:
        """False when the transform never draws from its generator."""
        return True

    @property
    def decode_bytes(self) -> int | None:
        """The most memory one call holds while it decodes; None: it does not decode."""
        return None

    @abstractmethod
    def __call__(self, sample: Sample, rng: np.random.Generator, /) -> Sample:
        """The transformed ``sample``; every random choice drawn from ``rng``."""

    def bind(self, schema: SchemaLike | None, *, root: str | None) -> Transform:
        """This transform bound to the dataset's schema and root; by default itself."""
        return self

    def output_spec(self, specs: Specs) -> Specs | None:
        """The ``"image"``/``"mask"`` specs after this transform; None: no spec declared."""
        return None

    def apply_batch(
        self, columns: dict[str, Any], rngs: Sequence[np.random.Generator] | None,
        out: Mapping[str, np.ndarray],
    ) -> dict[str, Any] | None:
        """The batch form: this transform applied to every row of ``columns`` at once.

        ``columns``: one value a row for every feature (numeric features as one array,
        bytes features as a list); ``rngs``: row ``i``'s generator (None when the transform
        does not draw); ``out``: the batch rows to write ``"image"`` into. Returns the
        transformed columns, with ``out["image"]`` written, or None when it has no batch form
        for these columns (the loader then goes sample by sample). The rows must be the bytes
        ``__call__`` would give; any exception makes the loader redo the rows sample by
        sample, which reports it with the record. Default: None.
        """
        return None

    def bytes_into(self, names: Sequence[str], out: Mapping[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
        """The features (of ``names``, those the records hold) whose one bytes value a row
        :meth:`apply_batch` copies unchanged into that row of ``out``, each mapped to the
        ``out`` array it lands in viewed as one row of bytes a row (2-D uint8). The reader
        may copy such a value there as it reads; ``apply_batch`` then gets the column as a
        :class:`~shardfeed.format.columns.FilledColumn` whose ``is_in`` that array, and must
        still check every row (and may overwrite it). Default: none.
        """
        return {}


def bytes_into_of(transform: object) -> BytesInto | None:
    """``transform.bytes_into`` when it belongs to its batch form (defined by the class
    that defines ``apply_batch``, or one it derives from, other than TransformBase's
    default); else None."""
    if not has_batch_form(transform):
        return None
    mro = type(transform).__mro__
    owner = next((c for c in mro if "bytes_into" in vars(c)), None)
    batch_owner = next((c for c in mro if "apply_batch" in vars(c)), None)
    if owner is None or owner is TransformBase or batch_owner is None:
        return None
    method: BytesInto = transform.bytes_into  # type: ignore[attr-defined]
    return method if issubclass(batch_owner, owner) else None


BytesInto = Callable[[Sequence[str], Mapping[str, np.ndarray]], dict[str, np.ndarray]]
"""``transform.bytes_into(names, out)``; see :meth:`TransformBase.bytes_into`."""


def has_batch_form(transform: object) -> bool:
    """Whether ``transform`` has a batch form that is the batch form of its own ``__call__``:
    ``apply_batch`` overridden by the very class that defines ``__call__`` (a subclass that
    changes ``__call__`` but inherits ``apply_batch`` would have its change skipped)."""

    def owner(name: str) -> type | None:
        return next((c for c in type(transform).__mro__ if name in vars(c)), None)

    batch_owner = owner("apply_batch")
    return batch_owner not in (None, TransformBase) and batch_owner is owner("__call__")


class _NoRandomness:
    """The generator handed to transforms that declare ``draws_random = False``.

    Any use raises, so a transform that draws after all fails loudly instead of drawing from
    a generator that is not keyed by its sample.
    """

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(
            f"a transform that declares draws_random = False used its generator (rng.{name}); "
            "set draws_random = True on it (or leave the attribute out)"
        )

    def __reduce__(self) -> str:
        return "NO_RANDOMNESS"  # the module's singleton, also in worker processes

    def __repr__(self) -> str:
        return "NO_RANDOMNESS"


NO_RANDOMNESS: np.random.Generator = _NoRandomness()  # type: ignore[assignment]
"""Stands in for the generator of a transform that does not draw (see the module doc)."""


def draws_random(transform: object) -> bool:
    """False only when ``transform`` declares ``draws_random = False`` (it never draws)."""
    return bool(declared_member(transform, "draws_random", True))


def bind_transform(transform: Transform, schema: SchemaLike | None, *, root: str | None) -> Transform:
    """``transform.bind(schema, root=root)`` if it has one, else the transform itself."""
    if isinstance(transform, TransformBase):
        return transform.bind(schema, root=root)
    bind = declared_member(transform, "bind", None)
    if not callable(bind):
        return transform
    bound: Transform = bind(schema, root=root)
    return bound


def declared_member(transform: object, name: str, default: Any) -> Any:
    """A member of the contract as ``transform`` declares it: the one place one is looked
    up by name, for objects that do not derive from :class:`TransformBase`."""
    return getattr(transform, name, default)


def call_into(
    transform: Transform, sample: Sample, rng: np.random.Generator, out: np.ndarray | None
) -> Sample:
    """Run ``transform``; with ``out``, the returned ``sample["image"]`` is ``out``.

    Transforms with ``accepts_out`` write there directly; for others the result is copied
    (and cast) into ``out``. Raises ValueError when the shapes disagree.
    """
    if out is None:
        return transform(sample, rng)
    if declared_member(transform, "accepts_out", False):
        result: Sample = transform(sample, rng, out=out)  # type: ignore[call-arg]
        return result
    result = transform(sample, rng)
    image = result.get("image")
    if not isinstance(image, np.ndarray):
        raise TypeError(
            "the transform produced no 'image' array to write into the batch; end the "
            "pipeline with an op that outputs a fixed-size image (e.g. CenterCrop, CropOrPad)"
        )
    if image.shape != out.shape:
        raise ValueError(
            f"the transform produced an image of shape {image.shape} but the batch slot has "
            f"shape {out.shape}: end the pipeline with a fixed-size op (CropOrPad, Resize) of "
            "that size"
        )
    np.copyto(out, image, casting="unsafe")
    result["image"] = out
    return result


def output_spec_of(transform: Transform, specs: Specs) -> Specs | None:
    """Chain ``transform.output_spec``; None when the transform does not declare one."""
    method = declared_member(transform, "output_spec", None)
    if method is None:
        return None
    result: Specs | None = method(specs)
    return result


_TIMING = threading.local()


def child_timings() -> list[tuple[Any, float]]:
    """From now on, on this thread, the outermost :class:`Compose` running adds ``(child,
    seconds)`` of each child it runs to the list returned (cleared; the same list each
    call on a thread): how a loader sees which op its time goes to. Nested Composes are
    their parent's child."""
    timings: list[tuple[Any, float]] | None = getattr(_TIMING, "into", None)
    if timings is None:
        timings = _TIMING.into = []
    timings.clear()
    return timings


def stop_timings() -> None:
    """Composes of this thread stop adding to the list of :func:`child_timings`."""
    _TIMING.into = None


def _timings_here() -> list[tuple[Any, float]] | None:
    """This thread's timings list, for the outermost Compose only (see :func:`child_timings`):
    None while a Compose of this thread is already timing its children."""
    timings: list[tuple[Any, float]] | None = getattr(_TIMING, "into", None)
    if timings is None or getattr(_TIMING, "busy", False):
        return None
    return timings


class Compose(TransformBase):
    """Apply transforms in order.

    Determinism: as deterministic as its children; they share the one generator, in order.
    State: none. Memory: the intermediate arrays of one sample (of a slice in the batch
    form, :meth:`apply_batch`).
    """

    __slots__ = ("_draws", "_head", "_last", "_last_out", "transforms")
    accepts_out = True

    def __init__(self, transforms: Sequence[Transform], /) -> None:
        items = list(transforms)
        for t in items:
            if not callable(t):
                raise TypeError(
                    f"Compose takes transforms (callables sample, rng -> sample), got {t!r}; "
                    "wrap a plain f(sample) with shardfeed.transforms.as_transform(f)"
                )
        self.transforms: tuple[Transform, ...] = tuple(items)
        # Decided once here, not per sample: which child is last and whether it takes out=.
        self._head = self.transforms[:-1]
        self._last: Transform = self.transforms[-1] if self.transforms else _identity
        self._last_out = bool(declared_member(self._last, "accepts_out", False))
        self._draws = any(draws_random(t) for t in self.transforms)

    @property
    def draws_random(self) -> bool:
        """Whether any child draws from the generator."""
        return self._draws

    @property
    def decode_bytes(self) -> int | None:
        """The largest ``decode_bytes`` a child declares (they decode one after another);
        None when no child declares one."""
        declared = [d for d in (declared_member(t, "decode_bytes", None) for t in self.transforms)
                    if isinstance(d, int)]
        return max(declared) if declared else None

    def __call__(
        self, sample: Sample, rng: np.random.Generator, /, *, out: np.ndarray | None = None
    ) -> Sample:
        timings = _timings_here()
        if timings is not None:
            return self._timed_call(sample, rng, out, timings)
        for t in self._head:
            sample = t(sample, rng)
        if out is None:
            return self._last(sample, rng)
        if self._last_out:
            result: Sample = self._last(sample, rng, out=out)  # type: ignore[call-arg]
            return result
        return call_into(self._last, sample, rng, out)

    def _timed_call(self, sample: Sample, rng: np.random.Generator, out: np.ndarray | None,
                    timings: list[tuple[Any, float]]) -> Sample:
        """:meth:`__call__`, each child's seconds added to ``timings``."""
        _TIMING.busy = True  # a Compose among the children is timed as one child
        try:
            for t in self._head:
                started = time.perf_counter()
                sample = t(sample, rng)
                timings.append((t, time.perf_counter() - started))
            started = time.perf_counter()
            if out is None:
                result: Sample = self._last(sample, rng)
            elif self._last_out:
                result = self._last(sample, rng, out=out)  # type: ignore[call-arg]
            else:
                result = call_into(self._last, sample, rng, out)
            timings.append((self._last, time.perf_counter() - started))
            return result
        finally:
            _TIMING.busy = False

    def apply_batch(
        self, columns: dict[str, Any], rngs: Sequence[np.random.Generator] | None,
        out: Mapping[str, np.ndarray],
    ) -> dict[str, Any] | None:
        """The children's batch forms in turn (see :meth:`TransformBase.apply_batch`); None
        unless every child has one (:func:`has_batch_form`: a plain function has none, so a
        pipeline with one goes sample by sample) and each child before the last declares a
        fixed-shape ``"image"`` (``output_spec``), which it writes into a slice-sized buffer.
        Where this thread keeps :func:`child_timings`, each child's seconds go there.

        Determinism: child by child over the rows, each row's generator drawn by the
        children in order, as ``__call__`` draws. Memory: one buffer a child but the last.
        """
        children = self.transforms
        if not children or not all(has_batch_form(t) for t in children):
            return None
        image_out = out.get("image")
        if image_out is None:
            return None
        outs: list[Mapping[str, np.ndarray]] = []
        specs: Specs | None = {}
        for t in children[:-1]:
            specs = output_spec_of(t, specs or {})
            spec = specs.get("image") if specs else None
            if spec is None or not spec.fixed:
                return None
            shape = tuple(int(d) for d in spec.shape if d is not None)
            outs.append({"image": np.empty((len(image_out), *shape), spec.dtype)})
        outs.append(out)
        result: dict[str, Any] | None = columns
        timings = _timings_here()
        if timings is not None:
            _TIMING.busy = True  # a Compose among the children is timed as one child
        try:
            for t, stage_out in zip(children, outs):
                started = time.perf_counter() if timings is not None else 0.0
                result = t.apply_batch(result, rngs, stage_out)  # type: ignore[attr-defined]
                if timings is not None:
                    timings.append((t, time.perf_counter() - started))
                if result is None:
                    return None
            return result
        finally:
            if timings is not None:
                _TIMING.busy = False

    def bytes_into(self, names: Sequence[str], out: Mapping[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
        """A lone child's (see :meth:`TransformBase.bytes_into`); none with more children:
        each but the last writes into a buffer of its own."""
        inner = bytes_into_of(self.transforms[0]) if len(self.transforms) == 1 else None
        return inner(names, out) if inner is not None else {}

    def bind(self, schema: SchemaLike | None, *, root: str | None) -> Compose:
        """A copy with every child bound."""
        return Compose([bind_transform(t, schema, root=root) for t in self.transforms])

    def output_spec(self, specs: Specs | None = None) -> Specs | None:
        """The ``"image"``/``"mask"`` specs after every child, or None if a child is opaque.

        Call it on the bound pipeline; ``specs`` defaults to what the first op declares.
        """
        current: Specs | None = dict(specs or {})
        for t in self.transforms:
            if current is None:
                return None
            current = output_spec_of(t, current)
        return current

    def __iter__(self) -> Iterator[Transform]:
        return iter(self.transforms)

    def __len__(self) -> int:
        return len(self.transforms)

    def __repr__(self) -> str:
        inner = ", ".join(repr(t) for t in self.transforms)
        return f"Compose([{inner}])"


def _identity(sample: Sample, rng: np.random.Generator, /) -> Sample:
    return sample


__all__ = [
    "NO_RANDOMNESS",
    "ArraySpec",
    "Compose",
    "ImageInfoLike",
    "Sample",
    "SchemaLike",
    "Specs",
    "Transform",
    "TransformBase",
    "bind_transform",
    "call_into",
    "declared_member",
    "draws_random",
    "output_spec_of",
]
