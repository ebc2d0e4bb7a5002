"""Build DeepSpeed wheels once per target, prove them, publish them to a local wheelhouse."""

__version__ = "0.2.0"

# The recipe `build-wheel` builds when given none (the README's first command), relative to the
# checkout: here, below both the command line and the handlers that read it.
DEFAULT_RECIPE = "recipes/cpu.toml"
