"""The DeepSpeed sdist: fetched once through pip, verified by sha256, unpacked per build."""

from __future__ import annotations

import hashlib
import re
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


# Inserted at the top of DeepSpeed's OpBuilder.cpu_arch/simd_width in the build tree's op_builder
# (the copy setup.py imports; the package's own deepspeed/ops/op_builder is left as shipped).
_CPU_HOOKS = {
    "    def cpu_arch(self):\n": "DS_BUILDER_CPU_ARCH",
    "    def simd_width(self):\n": "DS_BUILDER_SIMD_WIDTH",
}


def patch_cpu_target(src: Path) -> None:
    """Let DS_BUILDER_CPU_ARCH / DS_BUILDER_SIMD_WIDTH replace -march=native and the host SIMD macro.

    DeepSpeed offers no setting for this, and a wheel compiled with -march=native on an AVX-512
    build host crashes on older nodes (DeepSpeed issues 1886, 7556). Without the variables the
    patched functions behave exactly as before.
    """
    path = src / "op_builder" / "builder.py"
    text = path.read_text(encoding="utf-8")
    for line, var in _CPU_HOOKS.items():
        if text.count(line) != 1 or not re.search(r"^import os$", text, re.MULTILINE):
            raise SourceError(
                f"cannot find {line.strip()!r} in {path}: this DeepSpeed version builds CPU ops differently",
                'set cpu_target = "native" in the recipe to build without the portable-CPU patch',
            )
        hook = f"        if os.environ.get({var!r}):  # ds-wheel-builder: portable CPU target\n"
        hook += f"            return os.environ[{var!r}]\n"
        if hook not in text:
            text = text.replace(line, line + hook)
    path.write_text(text, encoding="utf-8")
