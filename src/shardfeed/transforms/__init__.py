"""transforms layer."""
