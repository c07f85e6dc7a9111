"""Callables that do not derive from :class:`~shardfeed.transforms.base.TransformBase`,
wrapped once into the contract: :func:`as_transform` for a plain ``f(sample)``, :func:`adapt`
for whatever the Loader is given.

Determinism, state and memory: those of the wrapped callable; a wrapper adds none.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from shardfeed.transforms.base import (
    Sample,
    SchemaLike,
    Specs,
    Transform,
    TransformBase,
    declared_member,
)


class FunctionTransform(TransformBase):
    """A plain ``f(sample) -> sample`` used as a transform (it gets no generator).

    Determinism: whatever ``f`` does; it must not use global random state to stay
    reproducible. State: none. Memory: what ``f`` allocates.
    """

    __slots__ = ("function",)
    draws_random = False  # f gets no generator

    def __init__(self, function: Callable[[Sample], Sample], /) -> None:
        if not callable(function):
            raise TypeError(f"as_transform needs a callable f(sample) -> sample, got {function!r}")
        self.function = function

    def __call__(self, sample: Sample, rng: np.random.Generator, /) -> Sample:
        result = self.function(sample)
        if not isinstance(result, Mapping):
            raise TypeError(
                f"{self.function!r} returned {type(result).__name__}, not a sample dict; "
                "return the (modified) sample"
            )
        return dict(result) if not isinstance(result, dict) else result

    def __repr__(self) -> str:
        return f"as_transform({self.function!r})"


def as_transform(function: Callable[[Sample], Sample], /) -> Transform:
    """Wrap ``f(sample) -> sample`` into the ``(sample, rng) -> sample`` contract."""
    return FunctionTransform(function)


def adapt(transform: Callable[..., Sample]) -> TransformBase:
    """``transform`` as a :class:`TransformBase`, wrapped once: itself when it derives from
    the base; a one-argument ``f(sample)`` as a :class:`FunctionTransform` (it gets no
    generator); any other callable as a :class:`DeclaredTransform` (its members read now)."""
    if isinstance(transform, TransformBase):
        return transform
    if _takes_one_argument(transform):
        return FunctionTransform(transform)
    return DeclaredTransform(transform)


class DeclaredTransform(TransformBase):
    """A ``(sample, rng) -> sample`` callable that does not derive from
    :class:`TransformBase`, with the contract members it defines read once, here.

    Determinism, state and memory: those of ``inner``.
    """

    __slots__ = ("_accepts_out", "_decode_bytes", "_draws", "_output_spec", "inner")

    def __init__(self, inner: Callable[..., Sample], /) -> None:
        self.inner = inner
        self._accepts_out = bool(declared_member(inner, "accepts_out", False))
        self._draws = bool(declared_member(inner, "draws_random", True))
        decode_bytes = declared_member(inner, "decode_bytes", None)
        self._decode_bytes = decode_bytes if isinstance(decode_bytes, int) else None
        self._output_spec: Callable[[Specs], Specs | None] | None = declared_member(
            inner, "output_spec", None)

    @property
    def accepts_out(self) -> bool:
        return self._accepts_out

    @property
    def draws_random(self) -> bool:
        return self._draws

    @property
    def decode_bytes(self) -> int | None:
        return self._decode_bytes

    def __call__(
        self, sample: Sample, rng: np.random.Generator, /, *, out: np.ndarray | None = None
    ) -> Sample:
        if out is None:
            return self.inner(sample, rng)
        return self.inner(sample, rng, out=out)

    def bind(self, schema: SchemaLike | None, *, root: str | None) -> Transform:
        bind = declared_member(self.inner, "bind", None)
        if bind is None or isinstance(self.inner, type):
            return self
        return adapt(bind(schema, root=root))

    def output_spec(self, specs: Specs) -> Specs | None:
        return None if self._output_spec is None else self._output_spec(specs)

    def __repr__(self) -> str:
        return repr(self.inner)


def _takes_one_argument(fn: Callable[..., Any]) -> bool:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    positional = [
        p for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    has_var = any(p.kind == p.VAR_POSITIONAL for p in signature.parameters.values())
    return len(positional) == 1 and not has_var


__all__ = ["DeclaredTransform", "FunctionTransform", "adapt", "as_transform"]
