"""The compiled part of the format layer, when the package was built with it.

``wire`` is the extension module ``shardfeed.format._wire`` (source: ``_wire.c`` beside this
file), or None where it was not compiled (``pip`` installs the package without it when no C
compiler is at hand). It does for a batch of records what :mod:`~shardfeed.format.framing`
and :mod:`~shardfeed.format.columns` do record by record: check framing and CRCs, and gather
the features of many ``tf.train.Example`` messages into columns. Every caller keeps the
Python code beside it: what the compiled part does not accept goes there, which gives the same
values and raises the same errors, so results never depend on whether it is built. Tests run
both and compare.

Memory: the payloads and columns it returns.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def compiled_module(name: str) -> ModuleType | None:
    """The compiled extension module ``name``, or None where the package was built without
    it (no C compiler): the Python code beside each use then does the same work."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


wire = compiled_module("shardfeed.format._wire")

__all__ = ["compiled_module", "wire"]
