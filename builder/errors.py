"""The few errors the toolkit raises; each carries the fix and its own exit code.

They are caught in one place (`cli.main`), which prints the message and the fix and exits with
`exit_code`; a traceback is shown only with --debug.
"""

from __future__ import annotations


class BuilderError(Exception):
    """A problem the user can fix: `message` says what is wrong, `fix` what to do."""

    exit_code = 1

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class RecipeError(BuilderError):
    """The recipe is malformed or asks for something that does not exist."""

    exit_code = 2


class UsageError(RecipeError):
    """An option or environment setting the user gave is malformed (exit 2, as argparse's own)."""


class ToolError(BuilderError):
    """A program the step needs is missing, or a command it ran failed."""

    exit_code = 3


class SourceError(BuilderError):
    """The DeepSpeed source could not be fetched or failed its hash check."""

    exit_code = 4


class BuildError(BuilderError):
    """The build failed or produced a wheel that does not hold what was asked for."""

    exit_code = 5


class SmokeError(BuilderError):
    """The wheel failed its smoke tests."""

    exit_code = 6


class PublishError(BuilderError):
    """The wheel cannot be published (no passing smoke report, a clash in the wheelhouse)."""

    exit_code = 7


class WheelhouseError(BuilderError):
    """A wheelhouse failed verification (tampered or missing files, index drift)."""

    exit_code = 8


class FolderError(BuilderError):
    """A folder the toolkit must write to (work folder, wheelhouse, toolchain folder) is unusable."""

    exit_code = 10


class MatrixError(BuilderError):
    """Some targets of a matrix failed; the others were built, smoked and published."""

    exit_code = 11


class ImageError(BuilderError):
    """A CI image cannot be built, proven or published (podman, base, lock, disk)."""

    exit_code = 12


class NoRoom(ToolError):
    """A program ran out of room (a full disk, a quota, a read-only folder): a ToolError, so a caller
    that cleans up after one still does, with the folder errors' exit code."""

    exit_code = 10


class TrustError(BuilderError):
    """The signing key cannot be used (missing where it must exist, readable by others, unusable)."""

    exit_code = 13


class ConfigError(BuilderError):
    """A DeepSpeed config does not run from the wheel: it needs an op the wheel lacks, DeepSpeed
    refuses it, it fails, or it cannot be read."""

    exit_code = 14


class RootError(BuilderError):
    """The build root cannot be made, entered or trusted (a folder that is no root, one others can
    write, no debootstrap, no namespaces)."""

    exit_code = 15
