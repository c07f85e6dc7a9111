"""dataset layer."""
