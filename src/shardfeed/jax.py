"""``import shardfeed.jax`` is :mod:`shardfeed.loaders.jax` (the same module object, so
``from shardfeed.jax import ...`` works as ``shardfeed.jax.<name>`` does)."""

import sys

from shardfeed.loaders import jax as _adapter

sys.modules[__name__] = _adapter
