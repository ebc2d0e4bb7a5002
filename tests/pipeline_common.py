"""What the tests of the default recipe's build share (test_pipeline*.py): its wheel's name and ops,
and the one way they run a builder command. The build itself is conftest's `default_build`, made once
per test run and read by all four files, each of which a pytest worker can run beside the others."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.19.8+cpu.torch2.13"
# The default recipe's floor: compiled in the toolkit's Debian 11 root (gcc 10) with pow pinned, its ops
# need GLIBC_2.17 at most (manylinux_2_24); the wheel takes torch 2.13.0's own floor, manylinux_2_28.
PLATFORM = "manylinux_2_28_x86_64"
WHEEL = f"deepspeed-{VERSION}-cp311-cp311-{PLATFORM}.whl"
OPS = ("cpu_adam", "cpu_adagrad", "cpu_lion", "deepspeed_shm_comm", "fused_adam")
OPTIMIZERS = OPS[:3]  # checked against torch's; shm comm is what the CPU engine loads at init


def builder(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=ROOT, capture_output=True, text=True, env=env)
