"""The DeepSpeed sdist: fetched once through pip, verified by sha256, unpacked per build."""

from __future__ import annotations

import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

from builder import cmd
from builder.archives import extract
from builder.errors import SourceError, ToolError
from builder.files import env_folder, make_dirs, sha256_of
from builder.recipe import DeepSpeedSource
from builder.resources import resource

SDIST_CACHE_ENV = "DS_BUILDER_SDIST_CACHE"


def sdist_folder(cache: Path, env: Mapping[str, str]) -> Path:
    """Where sdists are kept: DS_BUILDER_SDIST_CACHE (one folder shared by several work folders,
    e.g. the test suite's, or a cluster's shared filesystem), else the work folder's cache."""
    shared = env_folder(env, SDIST_CACHE_ENV, "DeepSpeed sdists and their temporary folders")
    return shared if shared is not None else cache / "sdists"


def fetch(source: DeepSpeedSource, sdists: Path, log: Path, verbose: bool = False) -> Path:
    """The verified sdist for `source`, downloaded with pip on first use and kept in `sdists`.

    The file enters the cache only after its sha256 matched the recipe (through a temporary
    folder and a rename, so several builders may share one cache), and it is checked again on
    every use, so a tampered or truncated file is never trusted.
    """
    target = sdists / source.sha256 / f"deepspeed-{source.version}.tar.gz"
    if target.is_file():
        _verify(target, source.sha256)
        return target
    make_dirs(target.parent)  # 2775 in a group-shared cache
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


MAX_SDIST_MEMBERS = 50_000  # DeepSpeed 0.19.8's sdist holds about 2,800


def unpack(sdist: Path, dest: Path) -> Path:
    """Unpack `sdist` into a fresh `dest` and return the source tree (the folder with setup.py)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    try:
        with tarfile.open(sdist) as tar:
            extract(tar, dest, str(sdist), MAX_SDIST_MEMBERS)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SourceError(f"cannot unpack {sdist.name}: {exc}", f"delete {sdist} and retry: it is not the "
                          "published sdist") from exc  # fmt: skip
    roots = [p for p in dest.iterdir() if (p / "setup.py").is_file()]
    if len(roots) != 1:
        raise SourceError(f"{sdist.name} does not hold one DeepSpeed source tree", "check the sdist")
    return roots[0]


HOOKS_MODULE = "ds_builder_hooks"  # resources/ds_build_hooks.py, copied into the source tree
_CALL = f"__import__({HOOKS_MODULE!r})"
_MARK = "  # ds-wheel-builder"

# One-line calls into the hooks module, inserted after their anchors in the build tree's op_builder
# (the copy setup.py imports; the package's own deepspeed/ops/op_builder is left as shipped) and
# in setup.py (after it picks torch's BuildExtension). The logic is in the resource file.
_OP_BUILDER_HOOKS = {
    "    def cpu_arch(self):\n": f"        if {_CALL}.cpu_arch():{_MARK}\n            return {_CALL}.cpu_arch()\n",
    "    def simd_width(self):\n": (
        f"        if {_CALL}.simd_width():{_MARK}\n            return {_CALL}.simd_width()\n"
    ),
    # Every op's compile flags pass through strip_empty_entries.
    "    def strip_empty_entries(self, args):\n": f"        args = {_CALL}.compile_args(args){_MARK}\n",
}
# Anchors DeepSpeed versions need not have: where one is missing, the build behaves as shipped and
# the check it exists for still runs afterwards (the arch list is read back from every .so).
_OPTIONAL_OP_BUILDER_HOOKS = {
    '        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(arch_tokens)\n': (
        f'        os.environ["TORCH_CUDA_ARCH_LIST"] = {_CALL}.arch_list(os.environ["TORCH_CUDA_ARCH_LIST"]){_MARK}\n'
    ),
}
# DeepSpeed's CPU accelerator builder (op_builder/cpu/builder.py), after it makes the extension.
_CPU_BUILDER_HOOKS = {
    "                                   extra_compile_args=compile_args)\n": (
        f"        cpp_ext = {_CALL}.cpu_link_args(cpp_ext, self){_MARK}\n"
    ),
}
_SETUP_HOOKS = {
    "    cmdclass['build_ext'] = get_accelerator().build_extension().with_options(use_ninja=use_ninja)\n": (
        f"    cmdclass['build_ext'] = {_CALL}.parallel_build_ext(cmdclass['build_ext']){_MARK}\n"
    ),
}


def _insert_hooks(path: Path, hooks: dict[str, str], optional: dict[str, str] | None = None) -> None:
    """Insert each hook after its anchor line, once (idempotent); refuse a file that lacks one
    (optional hooks are skipped where their anchor is missing)."""
    text = path.read_text(encoding="utf-8")
    present = {line: hook for line, hook in (optional or {}).items() if text.count(line) == 1}
    for line, hook in {**hooks, **present}.items():
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

    The hooks (portable CPU target, no -g, extensions built at once) are resources/ds_build_hooks.py,
    copied into the tree; each anchor gets a one-line call into it. Without the variables the
    patched code behaves exactly as before.
    """
    shutil.copyfile(resource("ds_build_hooks.py"), src / f"{HOOKS_MODULE}.py")
    _insert_hooks(src / "op_builder" / "builder.py", _OP_BUILDER_HOOKS, _OPTIONAL_OP_BUILDER_HOOKS)
    _insert_hooks(src / "setup.py", _SETUP_HOOKS)
    cpu_builder = src / "op_builder" / "cpu" / "builder.py"
    if cpu_builder.is_file():
        _insert_hooks(cpu_builder, {}, _CPU_BUILDER_HOOKS)


def sdist_requirements(sdist: Path) -> list[str]:
    """DeepSpeed's requirements/requirements.txt, read from the sdist without unpacking it."""
    with tarfile.open(sdist) as tf:
        member = next((m for m in tf.getmembers() if m.name.endswith("/requirements/requirements.txt")
                       and m.name.count("/") == 2 and m.isfile()), None)  # fmt: skip
        if member is None or (f := tf.extractfile(member)) is None:
            raise SourceError(f"{sdist.name} holds no requirements/requirements.txt", "check the recipe's sdist")
        text = f.read(1 << 20).decode("utf-8", errors="replace")
    return [r.strip() for r in text.splitlines() if r.strip() and not r.startswith("#")]
