"""loaders layer."""
