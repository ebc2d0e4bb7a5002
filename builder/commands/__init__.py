"""One handler per command, by stage: each takes the parsed arguments, calls the stage it names,
returns 0. Errors are raised, never printed here; `cli.main` turns them into one message and an exit
code. building (build-wheel, Slurm tasks, gather, detect, toolchain, bench), proving (smoke,
check-config), publishing (the wheelhouse's commands), provisioning (every node)."""

from __future__ import annotations

from builder.commands.building import (
    bench,
    build_wheel,
    detect,
    gather,
    slurm_collect,
    slurm_smoke,
    slurm_status,
    slurm_task,
    slurm_units,
    toolchain,
)
from builder.commands.proving import check_config, prove, smoke
from builder.commands.provisioning import provision
from builder.commands.publishing import image, key, lock, prune, publish, repair, serve, sign, verify

HANDLERS = {
    "build-wheel": build_wheel,
    "gather": gather,
    "slurm-collect": slurm_collect,
    "slurm-task": slurm_task,
    "slurm-units": slurm_units,
    "slurm-smoke": slurm_smoke,
    "slurm-status": slurm_status,
    "smoke": smoke,
    "prove": prove,
    "check-config": check_config,
    "publish": publish,
    "detect": detect,
    "toolchain": toolchain,
    "verify": verify,
    "sign": sign,
    "key": key,
    "repair": repair,
    "lock": lock,
    "image": image,
    "prune": prune,
    "provision": provision,
    "bench": bench,
    "serve": serve,
}
