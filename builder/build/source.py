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
from builder.errors import SourceError, ToolError
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
        try:
            cmd.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", tmp,
                 source.requirement],
                log=log,
                verbose=verbose,
            )  # fmt: skip
        except ToolError as exc:
            said = [line.strip() for line in exc.message.splitlines() if line.strip().startswith("ERROR:")]
            raise SourceError(
                f"pip could not download the DeepSpeed sdist {source.requirement}"
                + (f": {said[-1]}" if said else "")
                + f"\n  full log: {log}",
                f"check that DeepSpeed {source.version} exists (pip index versions deepspeed) and that the "
                "package index is reachable",
            ) from exc
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


def _return_env(var: str) -> str:
    return (
        f"        if os.environ.get({var!r}):  # ds-wheel-builder: portable CPU target\n"
        f"            return os.environ[{var!r}]\n"
    )


# Inserted at the top of methods of DeepSpeed's OpBuilder in the build tree's op_builder (the copy
# setup.py imports; the package's own deepspeed/ops/op_builder is left as shipped).
_OP_BUILDER_HOOKS = {
    "    def cpu_arch(self):\n": _return_env("DS_BUILDER_CPU_ARCH"),
    "    def simd_width(self):\n": _return_env("DS_BUILDER_SIMD_WIDTH"),
    # Every op's compile flags pass through strip_empty_entries.
    "    def strip_empty_entries(self, args):\n": (
        "        if os.environ.get('DS_BUILDER_NO_DEBUG'):  # ds-wheel-builder: no debug info to strip\n"
        "            args = [x for x in args if x != '-g']\n"
    ),
}

# Inserted after setup.py picks torch's BuildExtension. DS_BUILDER_PARALLEL builds that many
# extensions at once (pip's PEP 517 build takes no build_ext options). torch's BuildExtension writes
# every extension's ninja file to the one build_temp/build.ninja, so extensions built at once would
# overwrite each other's (seen on the GPU machine: "ninja: premature end of file", then ld missing
# cpu_adam.o); each extension gets its own folder under build_temp, named from its sources so that
# it is the same on every build.
_SETUP_HOOKS = {
    "    cmdclass['build_ext'] = get_accelerator().build_extension().with_options(use_ninja=use_ninja)\n": """\
    if os.environ.get('DS_BUILDER_PARALLEL'):  # ds-wheel-builder: extensions built at once
        import hashlib as _hashlib
        import threading as _threading

        class _ParallelBuildExt(cmdclass['build_ext']):
            _wrap_lock = _threading.Lock()

            def finalize_options(self):
                super().finalize_options()
                self.parallel = int(os.environ['DS_BUILDER_PARALLEL'])

            def build_extension(self, ext):
                with self._wrap_lock:
                    if not getattr(self.compiler, '_ds_own_temp', False):
                        inner = self.compiler.compile

                        def compile(sources, output_dir=None, *args, **kwargs):
                            if output_dir:
                                key = _hashlib.sha1('\\0'.join(sources).encode()).hexdigest()[:12]
                                output_dir = os.path.join(output_dir, key)
                            return inner(sources, output_dir, *args, **kwargs)

                        self.compiler.compile = compile
                        self.compiler._ds_own_temp = True
                super().build_extension(ext)

        cmdclass['build_ext'] = _ParallelBuildExt
""",
}


def _insert_hooks(path: Path, hooks: dict[str, str]) -> None:
    """Insert each hook after its anchor line, once (idempotent); refuse a file that lacks one."""
    text = path.read_text(encoding="utf-8")
    for line, hook in hooks.items():
        if text.count(line) != 1 or not re.search(r"^import os$", text, re.MULTILINE):
            raise SourceError(
                f"cannot find {line.strip()!r} in {path}: this DeepSpeed version differs from the one "
                "the toolkit patches",
                "build a DeepSpeed version the toolkit supports (0.19.x), or update builder/source.py for it",
            )
        if hook not in text:
            text = text.replace(line, line + hook)
    path.write_text(text, encoding="utf-8")


def patch_build_tree(src: Path) -> None:
    """Let DS_BUILDER_* variables set what DeepSpeed's build offers no setting for.

    DS_BUILDER_CPU_ARCH / DS_BUILDER_SIMD_WIDTH replace -march=native and the host SIMD macro: a
    wheel compiled with -march=native on an AVX-512 build host crashes on older nodes (DeepSpeed
    issues 1886, 7556). DS_BUILDER_NO_DEBUG drops -g when the wheel will be stripped anyway:
    generating debug info took a third of the compile time here (cpu_adam.cpp 30.6 s with -g,
    20.2 s without) and -g does not change GCC's code. DS_BUILDER_PARALLEL: see _SETUP_HOOKS.
    Without the variables the patched code behaves exactly as before.
    """
    _insert_hooks(src / "op_builder" / "builder.py", _OP_BUILDER_HOOKS)
    _insert_hooks(src / "setup.py", _SETUP_HOOKS)
