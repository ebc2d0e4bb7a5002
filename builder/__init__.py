"""Build DeepSpeed wheels once per target, prove them, publish them to a local wheelhouse."""

__version__ = "0.2.0"
