"""``import shardfeed.tf`` is :mod:`shardfeed.loaders.tensorflow` (the same module object, so
``from shardfeed.tf import ...`` works as ``shardfeed.tf.<name>`` does)."""

import sys

from shardfeed.loaders import tensorflow as _adapter

sys.modules[__name__] = _adapter
