"""What a run builds: targets (a recipe for one Python), found interpreters, and matrix files.

A cluster runs several Pythons (images with 3.10 to 3.12): each interpreter named by a recipe's
`python = [...]`, by `--python`, or by a matrix file gets its own build environment, wheel (its cp
tag), smoke and manifest entry. Interpreters are found on this machine (PATH, then pyenv's
versions), never downloaded. Candidate listing and matrix expansion are pure; `find_interpreter`
runs each candidate once to ask its version.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.cmd import query
from builder.errors import BuilderError, RecipeError, ToolError
from builder.recipe import ON_OP_FAILURE, SLURM_SIZES, Recipe, check_slurm_table, load_recipe

_VERSION_SPEC = re.compile(r"^3\.\d{1,2}$")


@dataclass(frozen=True)
class Interpreter:
    path: Path
    version: str  # "3.12.1"

    @property
    def tag(self) -> str:
        major, minor = self.version.split(".")[:2]
        return f"cp{major}{minor}"

    @property
    def own(self) -> bool:
        """The interpreter running the builder (its build env and work folders keep their old names)."""
        return self.path == Path(sys.executable)


def this_interpreter() -> Interpreter:
    return Interpreter(Path(sys.executable), ".".join(map(str, sys.version_info[:3])))


@dataclass(frozen=True)
class Target:
    """One recipe for one interpreter: its own work folder, build env, wheel, smoke and log."""

    recipe: Recipe
    python: Interpreter

    @property
    def name(self) -> str:
        base = self.recipe.name
        if self.recipe.deepspeed_suffix:
            base = f"{base}-ds{self.recipe.deepspeed.version}"
        return base if self.python.own else f"{base}-{self.python.tag}"


def candidates(version: str, path_env: str, pyenv_root: Path | None) -> list[Path]:
    """Where `python3.X` may live, best first: PATH (pyenv's shims left out: they fail for a
    version that is not active), then pyenv's installed versions, newest patch first (pure)."""
    found: list[Path] = []
    for folder in path_env.split(os.pathsep):
        if folder and Path(folder).name != "shims":
            found.append(Path(folder) / f"python{version}")
    if pyenv_root is not None:
        versions = sorted(
            (pyenv_root / "versions").glob(f"{version}.*"),
            key=lambda p: [int(x) if x.isdigit() else -1 for x in p.name.split(".")],
            reverse=True,
        )
        found += [v / "bin" / f"python{version}" for v in versions]
    return found


_ASK = "import sys; print('.'.join(map(str, sys.version_info[:3])))"


def find_interpreter(spec: str, env: Mapping[str, str] | None = None) -> Interpreter:
    """The interpreter for `3.12` (found on this machine) or a path; ToolError naming where it looked."""
    env = os.environ if env is None else env
    own = this_interpreter()
    if _VERSION_SPEC.match(spec):
        if own.version.startswith(spec + "."):
            return own
        root = env.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
        looked = candidates(spec, env.get("PATH", ""), Path(root))
        for path in looked:
            if path.is_file() and os.access(path, os.X_OK):
                found = _ask(path)
                if found and found.version.startswith(spec + "."):
                    return found
        raise ToolError(
            f"no Python {spec} on this machine (looked for python{spec} on PATH and in {root}/versions)",
            f"install it (e.g. pyenv install {spec}, or apt-get install python{spec}), or pass its path",
        )
    path = Path(spec).expanduser()
    if "/" not in spec or not path.is_file():
        raise RecipeError(
            f'python "{spec}" is neither a version like 3.12 nor an existing interpreter path',
            'write python = ["3.10", "3.12"] or give the full path of an interpreter',
        )
    found = _ask(path)
    if found is None:
        raise ToolError(f"{path} did not run as a Python interpreter", "pass a working python3 executable")
    if path.resolve() == Path(sys.executable).resolve():
        return this_interpreter()
    return found


def _ask(path: Path) -> Interpreter | None:
    try:
        version = query([str(path), "-c", _ASK]).strip()
    except BuilderError:
        return None
    return Interpreter(path, version) if re.match(r"^3\.\d+\.\d+$", version) else None


def targets_for(recipes: Sequence[Recipe], pythons: Sequence[str] = ()) -> list[Target]:
    """Every recipe for each interpreter: `pythons` (the command line) before the recipe's own
    list, before the interpreter running the builder."""
    out = []
    for recipe in recipes:
        specs = list(pythons) or list(recipe.python)
        if specs and recipe.torch.system:
            raise RecipeError(
                f'{recipe.path or recipe.name}: torch = "system" builds for the interpreter running the builder',
                "run the builder with that interpreter instead of naming Pythons",
            )
        interpreters = [find_interpreter(s) for s in specs] if specs else [this_interpreter()]
        seen: set[str] = set()
        for interp in interpreters:
            if interp.tag not in seen:
                seen.add(interp.tag)
                out.append(Target(recipe, interp))
    names = [t.name for t in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RecipeError(f"two targets are both named {', '.join(dupes)}", "give each recipe its own name")
    return out


def select(targets: Sequence[Target], name: str, where: str = "the matrix") -> Target:
    """The target called `name` (build-wheel --target, a Slurm build task)."""
    for t in targets:
        if t.name == name:
            return t
    raise RecipeError(f'{where} has no target "{name}"', f"its targets: {', '.join(t.name for t in targets)}")


# ---------------------------------------------------------------- matrix files


@dataclass(frozen=True)
class Matrix:
    """A matrix.toml: recipes x Pythons (x DeepSpeed versions), and how many targets at once."""

    path: Path
    recipes: tuple[Recipe, ...]
    python: tuple[str, ...]
    jobs: int | None  # None: as many as cores and memory allow
    slurm: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # [slurm]: cpus, mem, time, partition, account
    gpu: Mapping[str, GpuSmoke] = dataclasses.field(default_factory=dict)  # [slurm.gpu]: arch -> where it smokes


@dataclass(frozen=True)
class GpuSmoke:
    """[slurm.gpu] "9.0" = { partition = "h100", gres = "gpu:1" }: CUDA targets built for that arch
    are smoked on that partition. require_gpu = false only where the GPUs are fake (tests)."""

    partition: str
    gres: str = "gpu:1"
    require_gpu: bool = True
    time: str = "00:30:00"


_MATRIX_KEYS = {"recipes": list, "python": list, "deepspeed": list, "jobs": int, "on_op_failure": str, "slurm": dict}
_SLURM_KEYS = {**SLURM_SIZES, "partition": str, "account": str, "compiler_cache": Path, "unit_tasks": int}
_GPU_KEYS = {"partition": str, "gres": str, "require_gpu": bool, "time": str}


def load_matrix(path: Path) -> Matrix:
    """Read and check a matrix file; recipe paths are relative to it."""
    from builder.recipe import read_toml

    return parse_matrix(read_toml(path, "matrix", "--matrix"), path)


def parse_matrix(data: Mapping[str, Any], path: Path) -> Matrix:
    for key, value in data.items():
        if key not in _MATRIX_KEYS:
            raise RecipeError(f'{path}: unknown key "{key}"', f"allowed keys: {', '.join(_MATRIX_KEYS)}")
        if not isinstance(value, _MATRIX_KEYS[key]) or isinstance(value, bool):
            raise RecipeError(f"{path}: {key} has the wrong type", "see the matrix example in docs/pipeline.md")
    files = data.get("recipes") or []
    if not files or not all(isinstance(f, str) for f in files):
        raise RecipeError(f"{path}: recipes must list recipe files", 'e.g. recipes = ["recipes/cpu.toml"]')
    pythons = data.get("python", [])
    if not all(isinstance(p, str) for p in pythons):
        raise RecipeError(f"{path}: python must list versions or paths", 'e.g. python = ["3.10", "3.12"]')
    base = [load_recipe((path.parent / f).resolve()) for f in files]
    if "on_op_failure" in data:  # for every recipe of the matrix: a failing op drops, or fails its target
        if data["on_op_failure"] not in ON_OP_FAILURE:
            raise RecipeError(f'{path}: on_op_failure = "{str(data["on_op_failure"])[:40]}" is not one of '
                              f"{', '.join(ON_OP_FAILURE)}", "fail (the default) or drop")  # fmt: skip
        base = [dataclasses.replace(r, on_op_failure=data["on_op_failure"]) for r in base]
    versions = data.get("deepspeed", [])
    recipes = list(base)
    if versions:
        recipes = []
        for item in versions:
            if not isinstance(item, dict) or set(item) != {"version", "sha256"}:
                raise RecipeError(
                    f"{path}: each deepspeed entry needs version and sha256 (and nothing else)",
                    'e.g. deepspeed = [{ version = "0.18.9", sha256 = "..." }]',
                )
            version = item["version"]
            if not isinstance(version, str) or not re.match(r"^\d+(\.\d+){1,3}$", version):
                raise RecipeError(
                    f"{path}: deepspeed version {str(version)[:40]!r} is not a release version",
                    'write it like "0.18.9"',
                )  # fmt: skip (it names work folders)
            if not isinstance(item["sha256"], str) or not re.match(r"^[0-9a-fA-F]{64}$", item["sha256"]):
                raise RecipeError(f"{path}: deepspeed {item['version']}: sha256 is not a sha256 hex digest",
                                  "copy the sha256 of that version's sdist from PyPI")  # fmt: skip
            for recipe in base:
                ds = dataclasses.replace(recipe.deepspeed, version=item["version"], sha256=item["sha256"].lower())
                recipes.append(dataclasses.replace(recipe, deepspeed=ds, deepspeed_suffix=True))
    jobs = data.get("jobs")
    if jobs is not None and jobs < 1:
        raise RecipeError(f"{path}: jobs must be 1 or more", "jobs = 1 builds one target at a time")
    slurm = dict(data.get("slurm", {}))
    gpu = _gpu_table(slurm.pop("gpu", {}), path)
    example = 'e.g. cpus = 8, mem = "24G", compiler_cache = "/shared/ccache" (a path every node sees)'
    slurm = check_slurm_table(slurm, _SLURM_KEYS, str(path), "slurm.", example)
    return Matrix(path, tuple(recipes), tuple(pythons), jobs, slurm, gpu)


def gpu_key(machine: str, gpu: str) -> str:
    """[slurm.gpu]'s key for the GPUs `gpu` (a compute capability) of nodes of `machine`."""
    from builder.machines import HOST

    return gpu if machine == HOST else f"{machine}/{gpu}"


def _gpu_table(table: Any, path: Path) -> dict[str, GpuSmoke]:
    """[slurm.gpu]: each arch (torch's spelling, "9.0") to the partition its smoke job runs on; "aarch64/9.0"
    for the wheels of aarch64 targets (GH200 nodes: an H100 partition of x86_64 nodes cannot run them)."""
    from builder.archs import gpu_of, normalize
    from builder.machines import BUILDABLE, HOST

    if not isinstance(table, dict):
        raise RecipeError(f"{path}: slurm.gpu must be a table", '[slurm.gpu] "9.0" = { partition = "h100" }')
    out: dict[str, GpuSmoke] = {}
    for arch, item in table.items():
        where = f'{path}: slurm.gpu."{arch}"'
        machine, _, arch = arch.rpartition("/")
        if machine and machine not in BUILDABLE:
            raise RecipeError(f'{where}: "{machine}" is not a machine this toolkit builds for',
                              f'name one of {", ".join(BUILDABLE)} before the arch ("aarch64/9.0": GH200 '
                              f"nodes), or none for this machine's ({HOST})")  # fmt: skip
        try:
            norm = normalize(arch)
        except RecipeError as exc:
            raise RecipeError(f"{where}: {exc.message}", exc.fix) from exc
        if len(norm) != 1:
            raise RecipeError(f'{where}: "{arch}" names several archs', 'one compute capability a key: "9.0"')
        if not isinstance(item, dict) or "partition" not in item:
            raise RecipeError(f"{where} needs a partition", '"9.0" = { partition = "h100", gres = "gpu:1" }')
        check_slurm_table(item, _GPU_KEYS, where, "",
                          'e.g. partition = "h100", gres = "gpu:h100:1", time = "00:30:00"')  # fmt: skip
        out[gpu_key(machine or HOST, gpu_of(norm[0]))] = GpuSmoke(**item)
    return out
