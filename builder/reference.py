"""Whose failure is it: a config that fails from the wheel, run again without the wheel.

The reference is the same DeepSpeed (the recipe's sdist, sha256 checked) and the same torch, with
none of the wheel's ops: DeepSpeed installed with DS_BUILD_OPS=0, compiling at first use what a
config asks for, the way upstream ships it (on the CPU accelerator the engine compiles
deepspeed_shm_comm at initialize, so with compiles refused not one config would run: measured).
A config that fails there with the same error is DeepSpeed's own (or torch's) failure, not the
wheel's; one that passes there, or fails differently, is the wheel's. The environment and what it
compiled are kept in the work folder's cache, made once per DeepSpeed, torch and Python.

`judge` is pure; `blame` makes the environment and runs the configs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder import configs, envs, output
from builder.contracts import BuildManifest
from builder.errors import BuilderError
from builder.recipe import DeepSpeedSource, TorchSpec
from builder.resources.config_check.jit import ALLOW_JIT_ENV
from builder.wheelbuild import source
from builder.workspace import Workspace

TIMEOUT = 900.0  # seconds per config: its first one may compile an op or two at first use (60 s each here)
EXTENSIONS = "torch_extensions"  # in the reference venv: what DeepSpeed compiled there, kept for the next run


def judge(failed: configs.Outcome, reference: configs.Outcome | None, versions: str) -> configs.Blame:
    """Whose failure `failed` is, given the same config's outcome in the reference (pure)."""
    said = configs.signature(failed.detail)
    if reference is None:
        return configs.Blame("unknown", f"the reference ({versions}) did not report on this config")
    if reference.status == "passed":
        return configs.Blame("wheel", f"the config passes with {versions}: this failure happens only with the wheel")
    if reference.status == "failed" and said and configs.signature(reference.detail) == said:
        compiled = f"; it compiled {', '.join(reference.jit)} at first use" if reference.jit else ""
        return configs.Blame("deepspeed", f"DeepSpeed's own failure, not the wheel's: the same error with {versions}"
                                  f"{compiled}")  # fmt: skip
    there = configs.signature(reference.detail) or reference.status
    return configs.Blame("unknown", f"with {versions} the config ends otherwise ({reference.status}: "
                                    f"{there[:300]}), so this failure is not shown to be DeepSpeed's own")  # fmt: skip


def describe(manifest: BuildManifest) -> str:
    return (f"DeepSpeed {Version(manifest.version).public} from its sdist with no op prebuilt and torch "
            f"{manifest.torch_version}")  # fmt: skip


def environment(manifest: BuildManifest, ws: Workspace, base: Path | None, log: Path, verbose: bool = False) -> Path:
    """The reference venv for the wheel's DeepSpeed, torch and Python (`base`: the interpreter the
    smoke uses, None for the builder's own), made once, then reused (envs.cached)."""
    version = Version(manifest.version).public
    sdist = source.fetch(DeepSpeedSource(version, manifest.source_sha256), source.sdist_folder(ws.cache, os.environ),
                         log, verbose)  # fmt: skip
    torch = TorchSpec(Version(manifest.torch_version).public, manifest.torch_variant, manifest.torch_index)

    def deepspeed_without_ops(venv: Path) -> None:
        output.step(f"reference: {describe(manifest)}, in {venv}")
        # DeepSpeed's setup.py imports torch: no build isolation (it would hide torch, DeepSpeed issue 7286).
        # Its dependencies are already there (below): the sdist alone, so nothing is resolved again.
        envs.install_source(venv, sdist, {"DS_BUILD_OPS": "0", "DS_ACCELERATOR": manifest.accelerator}, log, verbose,
                            deps=False)  # fmt: skip
        (venv / EXTENSIONS).mkdir(exist_ok=True)

    key = [f"deepspeed-sdist={manifest.source_sha256}", f"accelerator={manifest.accelerator}"]
    return envs.cached(ws.cache / "reference", requirements(torch, source.sdist_requirements(sdist)), log, verbose,
                       manifest.recipe_torch == "system", base, envs.torch_index(torch), then=deepspeed_without_ops,
                       key=key)  # fmt: skip


def requirements(torch: TorchSpec, deepspeed: Sequence[str]) -> list[str]:
    """What the reference venv is made with before the sdist goes in (pure): the wheel's torch, the build
    tools, and DeepSpeed's own requirements less its torch. Made this way, a venv that reaches a node's
    packages counts them (envs.create asks the installer against the node's interpreter), so an
    air-gapped node's folder need not hold them, and no second torch is ever resolved, online or not:
    `uv pip install <sdist>` into such a venv resolved einops and torch again ("einops was not found")."""
    own = [r for r in deepspeed if canonicalize_name(Requirement(r).name) != "torch"]
    return list(dict.fromkeys([torch.requirement, "setuptools", "wheel", "ninja", *own]))


def blame(failed: Sequence[configs.Outcome], cases: Sequence[configs.ConfigCase], manifest: BuildManifest,
          ws: Workspace, base: Path | None, folders: Mapping[str, str], work: Path, log: Path,
          verbose: bool = False) -> dict[str, configs.Blame]:  # fmt: skip
    """Each failed config's blame, from running it in the reference (in `work`, with `folders`: an
    empty TMPDIR and extensions folder). A reference that cannot be made (no index, no sdist) leaves
    every failure the wheel's to answer for, and says why."""
    if not failed:
        return {}
    names = {o.name for o in failed}
    versions = describe(manifest)
    output.step(f"smoke: {len(names)} config(s) failed from the wheel; running them with {versions} to tell "
                "whose failure each is")  # fmt: skip
    try:
        venv = environment(manifest, ws, base, log, verbose)
        python = envs.python_in(venv)
        env = {**envs.venv_environ(venv), **folders, "DS_ACCELERATOR": manifest.accelerator,
               ALLOW_JIT_ENV: str(venv / EXTENSIONS)}  # fmt: skip
        ran = configs.run(python, [c for c in cases if c.name in names], manifest.accelerator, env=env, cwd=work,
                          log=log, verbose=verbose, timeout=TIMEOUT)  # fmt: skip
    except BuilderError as exc:
        output.warn(f"reference: could not run ({exc.message}); the failures stay the wheel's")
        return {o.name: configs.Blame("unknown", f"the reference could not be run: {exc.message}") for o in failed}
    by_name = {o.name: o for o in ran}
    out = {o.name: judge(o, by_name.get(o.name), versions) for o in failed}
    for name, b in out.items():
        output.note(f"  {name}: {b.whose}: {b.why}")
    return out
