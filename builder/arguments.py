"""The command line's argument types (argparse `type=`), standard library only: `python -m builder
install` runs on nodes that have nothing else, and builder.cli imports this at its top."""

from __future__ import annotations

import argparse
from pathlib import Path


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535; 0 picks a free one)")
    return value


VARIANTS_HELP = (
    "also publish each CUDA wheel as a wheel variant labelled by its GPU archs, with a null fallback and "
    "<name>-<version>-variants.json, so `uv pip install --preview-features wheel-variants` picks the build for the "
    "node's GPU (experimental: the draft PEPs 817/825; pip ignores them). A wheelhouse that has variants keeps them "
    "up to date on every publish"
)


def folder_arg(text: str) -> Path:
    """A folder given as a path or as a file:// URL (publish prints file:// URLs)."""
    if text.startswith("file:"):
        from builder.node import InstallError, wheelhouse_base

        try:
            return Path(wheelhouse_base(text))
        except InstallError as exc:
            raise argparse.ArgumentTypeError(exc.message) from exc
    if "://" in text:
        raise argparse.ArgumentTypeError(f"{text}: give a folder or a file:// URL (http is for `install` only)")
    return Path(text)


def seconds(text: str) -> float:
    """The config checker's own time-limit type, imported when used (`install` imports nothing but
    the standard library)."""
    from builder.resources.config_check.cli import seconds_arg

    return seconds_arg(text)


def offline_options(p: argparse.ArgumentParser, with_trust: bool = True) -> None:
    """--offline DIR, the same for every command that installs (build-wheel, smoke, check-config, prove),
    and --trust, the key its offline.json must be signed by (prove's --trust serves both)."""
    help = "an air-gapped host: install only from DIR, a folder `gather` made on a connected machine (its sdist, "
    p.add_argument("--offline", type=Path, metavar="DIR", help=help + "wheels and build root; nothing else is reached; "
                   "its offline.json must be signed by a key this host trusts)")  # fmt: skip
    if with_trust:
        p.add_argument("--trust", action="append", default=[], metavar="KEY_OR_FILE",
                       help="with --offline: the gathering host's key (`python -m builder key show` there), as a line "
                       "or an allowed-signers file (default: this host's allowed_signers)")  # fmt: skip
