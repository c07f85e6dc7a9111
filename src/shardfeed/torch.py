"""``import shardfeed.torch`` is :mod:`shardfeed.loaders.torch` (the same module object, so
``from shardfeed.torch import ...`` works as ``shardfeed.torch.<name>`` does)."""

import sys

from shardfeed.loaders import torch as _adapter

sys.modules[__name__] = _adapter
