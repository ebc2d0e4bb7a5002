"""Where the toolkit keeps its files, so every step agrees on the layout of the work folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.errors import FolderError


def check_writable(folder: Path, option: str) -> None:
    """Fail early, with the option that moves it, when `folder` cannot be created or written."""
    import tempfile

    from builder.files import make_dirs

    try:
        make_dirs(folder)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        raise FolderError(
            f"cannot write to {folder}: {exc.strerror}",
            f"pass {option} with a folder you can write (a read-only checkout needs --work-dir and --wheelhouse)",
        ) from exc


@dataclass(frozen=True)
class Workspace:
    """cache/ (sdists, build envs), recipes/<name>/ (sources), logs/, dist/ (built wheels), tmp/."""

    root: Path

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def dist(self) -> Path:
        return self.root / "dist"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def scratch(self) -> Path:
        return self.root / "tmp"

    def check_writable(self) -> None:
        """The trust boundary's folder check first (the work folder's environments and sources run), as
        given: another user's link on its way, or a system folder, is refused before anything is made."""
        from builder.files import checked_folder
        from builder.node import shown

        what = "the work folder (environments, sources, logs)"
        checked_folder(self.root, f"--work-dir {shown(str(self.root))}", what,
                       "pass --work-dir with a folder of your own that only you (or root) can write")  # fmt: skip
        check_writable(self.root, "--work-dir")

    def recipe_dir(self, name: str) -> Path:
        """The work folder of one target (a recipe, or a recipe for another Python: cpu-cp312)."""
        return self.root / "recipes" / name
