"""What a wheel for another machine is compiled against: torch's wheel for that machine and its
Python's headers, fetched once per machine into the roots folder and never run here.

The build environment still runs the build host's torch of the same version (DeepSpeed's setup.py
and torch's cpp_extension are Python); the hooks (resources/ds_build_hooks.py) point cpp_extension at
the target's torch tree and setuptools at the target's Python headers, and name the .so for the
target's interpreter. torch's pybind11 ABI is read from both torches' libtorch_python.so: where they
differ, an op built with one would not talk to the other, so the build is refused before it starts.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from builder import cmd, glibc, output
from builder.errors import BuildError, RootError, ToolError
from builder.files import held, make_dirs, write_atomic
from builder.glibc import elf_machine
from builder.machines import Machine, is_cross, machine_of, manylinux_tags
from builder.recipe import Recipe, TorchSpec

# The libraries an op links against (cpp_extension: c10, torch, torch_cpu, torch_python); torch's
# others (its CUDA library is 410 MB on aarch64) are never needed to link a CPU op.
LINKED = ("libc10.so", "libtorch.so", "libtorch_cpu.so", "libtorch_python.so")
CUDA_LINKED = ("libc10_cuda.so", "libtorch_cuda.so")  # what CUDAExtension adds: -lc10_cuda -ltorch_cuda
# NVIDIA's wheel whose libcudart.so.N a CUDA op links (-lcudart); torch's aarch64 wheel pulls the same
# one on the node (its cuda-toolkit[cudart] dependency), so the op's DT_NEEDED is what the node has.
CUDA_RUNTIME = "nvidia-cuda-runtime"
# Debian's suite whose libpython3.X-dev holds that Python's headers for every Debian architecture.
HEADER_SUITES = {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}
_PYBIND = re.compile(rb"__pybind11_internals_v\w+__")
DONE = ".ds-builder-complete"  # written last: a folder without it is a killed fetch's, made again


@dataclass(frozen=True)
class CrossInputs:
    """The target's torch tree (its torch/ folder) and Python include folders, on the build host."""

    torch: Path
    python_include: tuple[Path, ...]
    cuda_lib: Path | None = None  # the target's libcudart.so (CUDA recipes only)

    def env(self, machine: Machine, python_version: str) -> dict[str, str]:
        """The variables the build hooks read (resources/ds_build_hooks.py)."""
        return {
            "DS_BUILDER_TORCH_TREE": str(self.torch),
            "DS_BUILDER_PYTHON_INCLUDE": os.pathsep.join(str(p) for p in self.python_include),
            "SETUPTOOLS_EXT_SUFFIX": machine.ext_suffix(python_version),
            **({"DS_BUILDER_CUDA_LIB": str(self.cuda_lib)} if self.cuda_lib else {}),
        }

    @property
    def folders(self) -> tuple[Path, ...]:
        """What the build root must see of them."""
        return (*self.python_include, self.torch, *((self.cuda_lib,) if self.cuda_lib else ()))


def host_torch(recipe: Recipe) -> TorchSpec:
    """The torch the build environment runs: the recipe's, or for a CPU wheel for another machine the
    same version's CPU build for this one (it only runs DeepSpeed's setup.py; the ops compile against
    the target machine's torch, wheelbuild/cross.py). A CUDA wheel's build runs the same version's CUDA
    build here (DeepSpeed's CUDA op builders check torch's CUDA against nvcc's, and nvcc runs here): the
    build without a +label, PyPI's, so that a +cpu wheel in pip's find-links cannot stand in for it."""
    if not is_cross(recipe.machine) or recipe.torch.system:
        return recipe.torch
    if recipe.accelerator == "cuda":
        return recipe.torch if recipe.torch.variant else dataclasses.replace(recipe.torch, unlabelled=True)
    return dataclasses.replace(recipe.torch, variant="cpu", index=None)


def inputs(recipe: Recipe, version: str, host_torch_dir: Path, logs: Path) -> CrossInputs:
    """torch's wheel and Python's headers for the recipe's machine (fetched once per machine, into the
    roots folder beside the root that compiles against them), checked against this machine's torch."""
    from builder.buildroot.make import roots_folder
    from builder.debian import host_mirror

    machine = machine_of(recipe.machine)
    shelf = roots_folder(os.environ) / f"for-{machine.name}"
    log = logs / f"{recipe.name}-cross.log"
    torch_requirement = recipe.torch.requirement
    index = ["--extra-index-url", recipe.torch.index_url] if recipe.torch.index_url else []
    cuda = recipe.accelerator == "cuda"
    tree = torch_tree(torch_requirement, machine, version, recipe.platform,
                      shelf / f"torch-{torch_requirement.removeprefix('torch==')}-py{version}{'-cuda' if cuda else ''}",
                      index, log, cuda=cuda)  # fmt: skip
    check_same_abi(host_torch_dir, tree, machine.name)
    headers = python_headers(machine, version, host_mirror(), shelf / f"python{version}-headers", os.environ, log)
    if not cuda:
        return CrossInputs(tree, headers)
    want = torch_cuda(tree)
    if want is None:
        raise BuildError(
            f"{torch_requirement} for {machine.name} is a CPU build (its version.py names no CUDA): "
            "CUDA ops cannot be built against it",
            f'pin a torch whose {machine.name} wheel is a CUDA build (PyPI\'s are from 2.11 on: version = "2.13.0")',
        )
    lib = cuda_runtime(machine, want, recipe.platform, shelf / f"cuda-runtime-{want}", log)
    return CrossInputs(tree, headers, lib)


def check_machine(tree: Path, machine: str) -> None:
    """BuildError unless every shared object of the wheel is an ELF file for the recipe's machine."""
    foreign = glibc.foreign_objects(tree, machine_of(machine).elf_machine)
    if foreign:
        raise BuildError(
            f"the wheel for {machine} holds shared objects that are not {machine} ELF files: "
            + ", ".join(f"{f} ({glibc.elf_machine(tree / f) or 'not ELF'})" for f in foreign[:6]),
            "a compiler for another machine ran: read the build log for the compiler each op used "
            f"(a cross build compiles with the root's {machine} compiler only)",
        )


def platforms(machine: Machine, floor: str) -> list[str]:
    """pip's --platform values for a node of `machine` whose glibc is `floor` (manylinux_2_28): pip asks
    for exactly the tags given, and torch's dependencies are tagged 2_17 to 2_28."""
    return [*manylinux_tags(machine.name, int(floor.rsplit("_", 1)[1])), f"manylinux2014_{machine.name}"]


def made_once(folder: Path, what: str, make: Callable[[Path], str]) -> None:
    """Make `folder` once per machine: under a lock beside it, `make(tmp)` fills tmp/tree (and returns
    what DONE records), renamed into place, DONE written last; a folder without DONE is a killed run's
    (ours), made again."""
    if (folder / DONE).is_file():
        return
    make_dirs(folder.parent)
    with held(folder.parent / f".{folder.name}.lock", what):
        if (folder / DONE).is_file():
            return
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.tmp-") as tmp:
            record = make(Path(tmp))
            shutil.rmtree(folder, ignore_errors=True)
            (Path(tmp) / "tree").rename(folder)
            write_atomic(folder / DONE, record)


def fetch_wheel(requirement: str, machine: Machine, floor: str, dest: Path, log: Path, pattern: str,
                extra: list[str], what: str) -> Path:  # fmt: skip
    """The one wheel of `requirement` for `machine` pip downloads into `dest` (never installed, never run):
    BuildError naming it where pip finds none."""
    argv: list[str | os.PathLike[str]] = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        *(a for p in platforms(machine, floor) for a in ("--platform", p)), *extra, "-d", dest, requirement,
    ]  # fmt: skip
    try:
        cmd.run(argv, log=log)
    except ToolError as exc:
        raise BuildError(f"pip found no {requirement} for {machine.name}{what}",
                         f"check that it is published for {machine.name} (pip download --platform "
                         f"manylinux_2_28_{machine.name} --only-binary=:all: --no-deps '{requirement}'); "
                         f"full log: {log}") from exc  # fmt: skip
    wheels = sorted(dest.glob(pattern))
    if len(wheels) != 1:
        raise BuildError(
            f"pip downloaded no {requirement.split('=')[0]} wheel for {machine.name}", f"read the log: {log}"
        )
    return wheels[0]


def torch_tree(requirement: str, machine: Machine, python_version: str, floor: str, folder: Path,
               index_args: list[str], log: Path, cuda: bool = False) -> Path:  # fmt: skip
    """torch's wheel for `machine` and this Python, fetched with pip (never installed, never run) and
    its headers and link libraries kept in `folder`; the torch/ folder inside it."""
    major_minor = ".".join(python_version.split(".")[:2])

    def make(tmp: Path) -> str:
        output.step(f"cross: fetching {requirement} for {machine.name} (its headers and libraries, never run here)")
        wheel = fetch_wheel(requirement, machine, floor, tmp, log, "torch-*.whl",
                            ["--python-version", major_minor, "--implementation", "cp", *index_args],
                            f" and Python {major_minor}")  # fmt: skip
        _unpack_torch(wheel, tmp / "tree", machine, LINKED + (CUDA_LINKED if cuda else ()))
        return f"{wheel.name}\n"

    made_once(folder, f"torch for {machine.name} ({requirement})", make)
    return folder / "torch"


def _unpack_torch(wheel: Path, dest: Path, machine: Machine, linked: tuple[str, ...] = LINKED) -> None:
    """torch/include/ and the link libraries of a torch wheel, each member's name checked."""
    with zipfile.ZipFile(wheel) as zf:
        wanted = [i for i in zf.infolist() if not i.is_dir() and (
            i.filename.startswith("torch/include/") or i.filename in {f"torch/lib/{n}" for n in linked}
            or i.filename == "torch/version.py"
            or re.fullmatch(r"torch-[^/]+\.dist-info/WHEEL", i.filename))]  # fmt: skip
        for info in wanted:
            parts = info.filename.split("/")
            if info.filename.startswith("/") or ".." in parts or "" in parts:
                raise BuildError(f"{wheel.name} holds a member named {info.filename[:120]!r}",
                                 "delete the download and fetch it again: it is not torch's wheel")  # fmt: skip
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            target.chmod(0o644)
    for name in linked:
        lib = dest / "torch" / "lib" / name
        if not lib.is_file() or elf_machine(lib) != machine.elf_machine:
            raise BuildError(f"{wheel.name} has no {name} for {machine.name}",
                             "the wheel pip chose is not torch's build for that machine; delete it and "
                             "retry")  # fmt: skip


def torch_wheel_text(torch: Path) -> str:
    """The WHEEL file of the target's torch wheel (its platform tag: torch's own glibc floor)."""
    found = sorted(torch.parent.glob("torch-*.dist-info/WHEEL"))
    return found[0].read_text(encoding="utf-8") if found else ""


def torch_version(torch: Path) -> str:
    """The target torch's __version__, read from its version.py (never imported)."""
    found = re.search(r"^__version__ = '([^']+)'$", (torch / "version.py").read_text(encoding="utf-8"), re.MULTILINE)
    if found is None:
        raise BuildError(f"{torch / 'version.py'} names no __version__",
                         "delete the folder; the next build fetches it again")  # fmt: skip
    return found[1]


def torch_cuda(torch: Path) -> str | None:
    """The CUDA major.minor the target torch was built with (its version.py's cuda), None for a CPU build."""
    found = re.search(r"^cuda: [^=]*= '(\d+\.\d+)'$", (torch / "version.py").read_text(encoding="utf-8"), re.MULTILINE)
    return found[1] if found else None


def cuda_runtime(machine: Machine, cuda: str, floor: str, folder: Path, log: Path) -> Path:
    """A folder holding libcudart.so for `machine` and CUDA `cuda` (major.minor), from NVIDIA's
    nvidia-cuda-runtime wheel for that machine (fetched with pip, never run); made once per machine."""
    requirement = f"{CUDA_RUNTIME}=={cuda}.*"

    def make(tmp: Path) -> str:
        output.step(f"cross: fetching {requirement} for {machine.name} (libcudart, to link against; never run here)")
        wheel = fetch_wheel(requirement, machine, floor, tmp, log, "nvidia_cuda_runtime-*.whl", [], "")
        lib = tmp / "tree" / "lib" / "libcudart.so"  # what -lcudart looks for; the op records its soname, .so.N
        lib.parent.mkdir(parents=True)
        with zipfile.ZipFile(wheel) as zf:
            members = [i for i in zf.infolist() if re.fullmatch(r"nvidia/[^/]+/lib/libcudart\.so\.\d+", i.filename)]
            if len(members) != 1:
                raise BuildError(f"{wheel.name} holds no libcudart.so.N",
                                 "delete the download and fetch it again: it is not NVIDIA's runtime "
                                 "wheel")  # fmt: skip
            with zf.open(members[0]) as src, open(lib, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        if elf_machine(lib) != machine.elf_machine:
            raise BuildError(f"{wheel.name}'s libcudart is not built for {machine.name}",
                             "the wheel pip chose is not NVIDIA's build for that machine; delete it and "
                             "retry")  # fmt: skip
        lib.chmod(0o644)
        return f"{wheel.name}\n"

    made_once(folder, f"CUDA {cuda}'s runtime for {machine.name}", make)
    return folder / "lib"


def pybind_abi(libtorch_python: Path) -> str | None:
    """The pybind11 internals id a torch was built with (its compiler, C++ library and ABI)."""
    try:
        found = _PYBIND.search(libtorch_python.read_bytes())
    except OSError:
        return None
    return found[0].decode() if found else None


def check_same_abi(host_torch: Path, target_torch: Path, machine: str) -> None:
    """BuildError where the build host's torch and the target's were built with other pybind11 ABIs."""
    ours, theirs = (pybind_abi(t / "lib" / "libtorch_python.so") for t in (host_torch, target_torch))
    if ours is None or theirs is None or ours != theirs:
        raise BuildError(
            f"torch in the build environment ({ours or 'unknown'}) and torch for {machine} ({theirs or 'unknown'}) "
            "were built with different pybind11 ABIs: an op compiled against one would not load with the other",
            "pin the same torch version for both (the recipe's [torch] version is used for both)",
        )


def python_headers(machine: Machine, python_version: str, mirror: str, folder: Path, env: Mapping[str, str],
                   log: Path) -> tuple[Path, ...]:  # fmt: skip
    """The include folders of CPython `python_version` for `machine`: Debian's libpython3.X-dev for that
    architecture (its pyconfig.h is the machine's own), fetched by debootstrap, which checks the
    archive's signature, and unpacked, never run; made once per machine."""
    from builder.buildroot.make import WAYS_OUT, debootstrap

    major_minor = ".".join(python_version.split(".")[:2])
    suite = HEADER_SUITES.get(major_minor)
    if suite is None:
        raise BuildError(
            f"the headers of Python {major_minor} for {machine.name} come from Debian, which has "
            f"{', '.join(sorted(HEADER_SUITES))} only",
            f"build the {machine.name} wheel for Python {' or '.join(sorted(HEADER_SUITES))} "
            "(recipe python = [...], or run the builder with that Python)",
        )
    include = folder / "usr" / "include"
    package = f"libpython{major_minor}-dev"

    def make(tmp: Path) -> str:
        if os.geteuid() != 0:
            raise RootError(
                f"fetching Python {major_minor}'s headers for {machine.name} needs root (debootstrap), and this is "
                f"user {os.geteuid()}",
                f"have root build one {machine.name} wheel once on this machine (it keeps them in {folder.parent}), "
                f"or {WAYS_OUT}",
            )
        program, run_env = debootstrap(folder.parent / "tools", log)
        output.step(f"cross: fetching {package} ({machine.debian}, Debian {suite}) for its headers, once per machine")
        cmd.run([program, "--download-only", f"--arch={machine.debian}", "--variant=minbase", f"--include={package}",
                 suite, tmp / "debs", mirror], env=run_env, log=log,
                fix=f"debootstrap needs the Debian mirror the host's apt uses (read {log})")  # fmt: skip
        debs = sorted((tmp / "debs" / "var" / "cache" / "apt" / "archives").glob(f"{package}_*_{machine.debian}.deb"))
        if len(debs) != 1:
            raise BuildError(f"debootstrap fetched no {package} for {machine.debian}", f"read the log: {log}")
        staged = tmp / "tree"
        cmd.run(["dpkg-deb", "-x", debs[0], staged], log=log)
        shutil.rmtree(staged / "usr" / "lib", ignore_errors=True)  # libpython's static archive: never linked
        shutil.rmtree(staged / "usr" / "share", ignore_errors=True)
        if not (staged / "usr" / "include" / machine.triplet / f"python{major_minor}" / "pyconfig.h").is_file():
            raise BuildError(f"{debs[0].name} holds no {machine.triplet} pyconfig.h", f"read the log: {log}")
        return f"{debs[0].name}\n"

    made_once(folder, f"Python {major_minor}'s headers for {machine.name}", make)
    return (include / f"python{major_minor}", include)
