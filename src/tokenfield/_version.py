"""The package version (its own module, so the ground floor can read it)."""

__version__ = "0.1.0"
