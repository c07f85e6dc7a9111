"""``import shardfeed.keras`` is :mod:`shardfeed.loaders.keras` (the same module object, so
``from shardfeed.keras import ...`` works as ``shardfeed.keras.<name>`` does)."""

import sys

from shardfeed.loaders import keras as _adapter

sys.modules[__name__] = _adapter
