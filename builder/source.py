"""The DeepSpeed sdist: fetched once through pip, verified by sha256, unpacked per build."""

from __future__ import annotations

import hashlib
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from builder import cmd
from builder.errors import SourceError
from builder.recipe import DeepSpeedSource


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(source: DeepSpeedSource, cache: Path, log: Path, verbose: bool = False) -> Path:
    """The verified sdist for `source`, downloaded with pip on first use and kept in `cache`.

    The file enters the cache only after its sha256 matched the recipe, so a tampered or
    truncated download never stays behind to be trusted later.
    """
    target = cache / "sdists" / source.sha256 / f"deepspeed-{source.version}.tar.gz"
    if target.is_file():
        _verify(target, source.sha256)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                tmp,
                source.requirement,
            ],
            log=log,
            verbose=verbose,
            fix=f"check that DeepSpeed {source.version} exists and that the package index is reachable",
        )
        found = sorted(Path(tmp).glob("deepspeed-*.tar.gz"))
        if not found:
            raise SourceError(f"pip downloaded no DeepSpeed sdist for {source.requirement}", "see the log: " + str(log))
        _verify(found[0], source.sha256)
        found[0].replace(target)
    return target


def _verify(path: Path, expected: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise SourceError(
            f"{path.name} has sha256 {actual}, the recipe pins {expected}",
            "if you changed the DeepSpeed version, put the new sdist's sha256 in the recipe; "
            "otherwise the download is not the published file: delete it and retry",
        )


def unpack(sdist: Path, dest: Path) -> Path:
    """Unpack `sdist` into a fresh `dest` and return the source tree (the folder with setup.py)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(dest, filter="data")
    roots = [p for p in dest.iterdir() if (p / "setup.py").is_file()]
    if len(roots) != 1:
        raise SourceError(f"{sdist.name} does not hold one DeepSpeed source tree", "check the sdist")
    return roots[0]
