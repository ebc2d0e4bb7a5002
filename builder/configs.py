"""DeepSpeed configs as the proof of a wheel: the smoke's matrix, a site's own config files, and
what each result means for a recipe.

Which ops a config needs is found by running it (resources/config_runner.py records every op
DeepSpeed's builders are asked for and refuses every JIT compile), never guessed from its text.
This module is the pure part: the matrix, reading config files, and turning the runner's results
into smoke checks and one-line summaries; `run` is the one side effect, in the environment given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder import cmd
from builder.contracts import Check
from builder.errors import ConfigError, SmokeError
from builder.node import CONFIG_OPTIMIZERS, OP_RE, Fields, ManifestError
from builder.resources import config_runner, report_after, resource

RUNNER = resource("config_runner.py")
MARKER = config_runner.MARKER
STATUSES = ("passed", "needs-op", "needs-compiler", "unsupported", "invalid", "no-gpu", "failed")
MAX_CONFIG = config_runner.MAX_CONFIG
TIMEOUT = 180.0  # seconds per config: a tiny model's initialize and steps take under 2 s here

# The optimizers DeepSpeed's config accepts and builds ops for (MuAdam/MuSGD come from `mup`,
# not DeepSpeed); offload where it applies (CPU from ZeRO 1, NVMe for ZeRO 3 with async_io).
OPTIMIZERS = CONFIG_OPTIMIZERS  # Adam, AdamW, Adagrad, Lion, Lamb, Muon
DTYPES = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "fp16", "bf16")}
MATRIX_PREFIX = "config:matrix/"
SITE_PREFIX = "config:site/"
# What a refused compile is named by: an op builder, or the name given to torch.utils.cpp_extension.load.
COMPILED = re.compile(r"^[\w.+-]{1,128}$")
SCRATCH = config_runner.SCRATCH  # the runner puts an NVMe folder on its work disk here


@dataclass(frozen=True)
class ConfigCase:
    """One config to run: its name, its JSON object, and where it came from."""

    name: str
    config: Mapping[str, Any]
    source: str = "matrix"  # matrix | a file's path
    error: str = ""  # a file that could not be read: reported in the config's place


@dataclass(frozen=True)
class Outcome:
    """What the runner found for one config."""

    name: str
    status: str
    detail: str
    ops: tuple[str, ...] = ()
    jit: tuple[str, ...] = ()
    world_size: int = 1
    seconds: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Blame:
    """Whose failure a failed config is, from running it without the wheel (builder.reference)."""

    whose: str  # "deepspeed": the same failure without the wheel; "wheel": only with the wheel; "unknown"
    why: str  # one line, with the versions the reference ran


def matrix(accelerator: str, ops: Sequence[str]) -> list[ConfigCase]:
    """optimizer x ZeRO stage x offload x dtype, the combinations DeepSpeed accepts."""
    cases = []
    for optimizer in OPTIMIZERS:
        for stage in range(4):
            offloads = ["none"] + (["cpu"] if stage else []) + (["nvme"] if stage == 3 and "async_io" in ops else [])
            for offload in offloads:
                for dtype in DTYPES[accelerator]:
                    cases.append(
                        ConfigCase(
                            f"{optimizer}/zero{stage}/{offload}/{dtype}",
                            matrix_config(optimizer, stage, offload, dtype),
                        )
                    )
    return cases


def matrix_config(optimizer: str, stage: int, offload: str, dtype: str) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu"}
    elif offload == "nvme":
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": SCRATCH}
        zero["offload_param"] = {"device": "nvme", "nvme_path": SCRATCH}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": optimizer, "params": {"lr": 1e-3}},
        "zero_optimization": zero,
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return config


def read_config(path: Path) -> ConfigCase:
    """A config file (config_runner.read_config_file: JSON, or a .py file of one dict literal, never
    run); a problem becomes the case's error, reported in the config's place."""
    config, error = config_runner.read_config_file(str(path))
    return ConfigCase(path.name, config or {}, str(path), error)


def runner_spec(cases: Sequence[ConfigCase], accelerator: str | None, timeout: float = TIMEOUT,
                jobs: int | None = None, max_world: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The runner's input: every case in order, unreadable ones as errors."""
    entries: list[dict[str, Any]] = []
    for case in cases:
        entry: dict[str, Any] = {"name": case.name}
        if case.error:
            entry["error"] = case.error
        else:
            entry["config"] = dict(case.config)
        if max_world:
            entry["max_world"] = max_world
        entries.append(entry)
    jobs = jobs or config_runner.default_jobs()
    return {"configs": entries, "accelerator": accelerator, "timeout": timeout, "jobs": jobs}


def parse_outcomes(said: str) -> list[Outcome]:
    """The runner's results, each validated (they come from another process)."""
    try:
        data = report_after(said, MARKER)
    except ValueError as exc:
        raise SmokeError(f"the config runner {exc}", "read its log") from exc
    outcomes = []
    for i, item in enumerate(data):
        try:
            f = Fields(item, f"config runner result {i}")
            outcomes.append(Outcome(f.get("name", str), f.choice("status", STATUSES), f.get("detail", str),
                                    f.texts("ops", OP_RE), f.texts("jit", COMPILED),
                                    f.get("world_size", int), float(f.get("seconds", (int, float)))))  # fmt: skip
        except ManifestError as exc:
            raise SmokeError(exc.message, "read its log") from exc
    return outcomes


def run(python: Path | str, cases: Sequence[ConfigCase], accelerator: str | None, *, env: Mapping[str, str],
        cwd: Path, log: Path, verbose: bool = False, timeout: float = TIMEOUT) -> list[Outcome]:  # fmt: skip
    """Run the cases with `python` (an environment holding torch and DeepSpeed)."""
    if not cases:
        return []
    spec = runner_spec(cases, accelerator, timeout)
    spec_file = cwd / "configs.json"
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    said = cmd.run([str(python), RUNNER, "--spec", str(spec_file)], env=env, cwd=cwd, log=log, verbose=verbose)
    return parse_outcomes(said)


_PATH = re.compile(r"(?:/[^\s'\":,()]+)+/")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def signature(detail: str) -> str:
    """A failure's first line (the exception and its message), without folders and addresses,
    which differ between two environments that fail the same way."""
    first = detail.strip().splitlines()[0] if detail.strip() else ""
    return _ADDRESS.sub("0x?", _PATH.sub("", first)).strip()


def recipe_line(ops: Sequence[str]) -> str:
    return f"add {', '.join(json.dumps(o) for o in ops)} to the recipe's ops"


def explain(outcome: Outcome, accelerator: str) -> str:
    """One line for people: what the result means and what to do (the runner's words, on a node too)."""
    return config_runner.explain({"status": outcome.status, "detail": outcome.detail, "ops": list(outcome.ops),
                                  "jit": list(outcome.jit)}, accelerator)  # fmt: skip


def as_check(outcome: Outcome, accelerator: str, site: bool, blame: Blame | None = None,
             known: str = "") -> Check:  # fmt: skip
    """A smoke check for a config. A site's config (the recipe names it) must run: anything but
    passed or DeepSpeed's own refusal fails the smoke. A matrix row is a statement about the wheel:
    a row needing an op the recipe does not build is skipped with the recipe line; a crash, time
    limit, or invalid matrix config fails (those are the toolkit's or the wheel's faults).

    A failure the reference run showed to be DeepSpeed's own (`blame`) is "upstream": it does not
    block a matrix row, nor a site config the recipe lists as a known failure (`known`: its reason);
    a site config not listed still fails, saying how to list it."""
    name = (SITE_PREFIX if site else MATRIX_PREFIX) + outcome.name
    text = explain(outcome, accelerator)
    if outcome.status == "passed":
        return Check(name, "passed", text)
    if outcome.status in ("unsupported", "needs-compiler", "no-gpu"):
        return Check(name, "skipped", text)
    if outcome.status == "needs-op" and not site:
        return Check(name, "skipped", text)
    if outcome.status == "failed" and blame is not None:
        said = f"{blame.why}: {signature(outcome.detail)}"
        if blame.whose == "deepspeed" and not site:
            return Check(name, "upstream", f"{said}\n{outcome.detail}")
        if blame.whose == "deepspeed" and known:
            return Check(name, "upstream", f"{said}; listed by the recipe as a known failure: {known}\n"
                                           f"{outcome.detail}")  # fmt: skip
        if blame.whose == "deepspeed":
            return Check(name, "failed", f"{said}; the recipe names this config, so it blocks publishing: list it "
                                         f'under [known_failures] with a reason ("{outcome.name}" = {{ reason = '
                                         '"...", link = "..." }) to publish anyway, or take it out of configs\n'
                                         f"{outcome.detail}")  # fmt: skip
        return Check(name, "failed", f"{text} ({blame.why})\n{outcome.detail}")
    return Check(name, "failed", text + ("" if outcome.status == "needs-op" else "\n" + outcome.detail))


def exit_status(outcomes: Sequence[Outcome]) -> int:
    """check-config's exit code: 0 when every config passed, else ConfigError's."""
    return 0 if all(o.status == "passed" for o in outcomes) else ConfigError.exit_code
