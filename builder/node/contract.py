"""What the build host and every node agree on: the wheelhouse's file names, schema version, exit codes,
size limits and the errors a node reports (each with its fix and exit code).
"""

import re

MANIFEST_FILE = "manifest.json"
INSTALLER = "tools/ds-node-install.py"
# builder/resources/config_check/ in one file (builder.configs.checker_source): runs DeepSpeed configs against the
# DeepSpeed installed on a node (install --check-config).
CONFIG_CHECK = "tools/ds-config-check.py"
EXIT_CONFIGS = 14  # a config does not run from the installed wheel
BUILD_MANIFEST = "ds_builder.json"  # inside the wheel's *.dist-info/
MANIFEST_SCHEMA = 4  # 3: each wheel lists its dependency files ("requires"); 4: the signed statement
ACCELERATORS = ("cpu", "cuda")
# In order of preference among wheels that fit a node and are otherwise equal: a node with SVE takes the
# armv8.2-a+sve wheel over the armv8-a one (node.choosing.choose).
CPU_TARGETS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "armv8-a", "armv8.2-a+sve", "native")
CHECK_STATUSES = ("passed", "failed", "skipped", "upstream")  # upstream: DeepSpeed's own failure, not the wheel's
# CPU features each portable target needs (the ones DeepSpeed's SIMD code uses). "native" has no
# fixed list: such a wheel needs every flag of the machine that built it (recorded in cpu_flags).
TARGET_FLAGS: "dict[str, tuple[str, ...]]" = {
    "x86-64": (),
    "x86-64-v2": ("sse4_2", "popcnt"),
    "x86-64-v3": ("avx2", "fma", "bmi2"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512dq", "avx512vl"),
    "armv8-a": ("asimd",),  # NEON, as an aarch64 kernel lists it
    "armv8.2-a+sve": ("asimd", "sve"),
}
EXIT_INSTALL = 9  # no wheel fits, a download failed, or the wheelhouse failed a check
EXIT_BAD_WHEELHOUSE = 8
# Everything read from a wheelhouse is read up to a limit far beyond any real one (a manifest of a
# thousand wheels is about 5 MB), so a hostile or damaged file cannot make a node or the build host
# use gigabytes of memory: past the limit it is refused, the limit named.
LIMITS = {
    "manifest": 32 << 20,
    "index page": 8 << 20,
    "wheel": 4 << 30,
    "report": 8 << 20,
    "probe": 1 << 20,
    "signature": 64 << 10,
    "trust": 1 << 20,
    "tool": 8 << 20,
}

# PEP 427 file name: name-version(-build)?-python-abi-platform.whl; no component holds '-'.
WHEEL_NAME_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?)-(?P<version>[A-Za-z0-9_.!+]+)"
    r"(?:-(?P<build>\d[A-Za-z0-9_.]*))?-(?P<python>[A-Za-z0-9_.]+)-(?P<abi>[A-Za-z0-9_.]+)"
    r"-(?P<platform>[A-Za-z0-9_.]+)\.whl$"
)
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
PYTHON_TAG_RE = re.compile(r"^cp3\d{1,2}$")
ARCH_RE = re.compile(r"^\d{1,2}\.\d[af]?(\+PTX)?$")
OP_RE = re.compile(r"^[a-z0-9_]{1,64}$")
CPU_FLAG_RE = re.compile(r"^[a-z0-9_.]{1,40}$")


class InstallError(Exception):
    """A problem on the node; `fix` says what to do, `exit_code` is what the process exits with."""

    exit_code = EXIT_INSTALL

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class ManifestError(InstallError):
    """A wheelhouse file that fails its contract: named with the file and the field."""

    exit_code = EXIT_BAD_WHEELHOUSE


class NoKey(InstallError):
    """Nothing to check the wheelhouse's signature with: refused as a wheelhouse that fails it would be."""

    exit_code = EXIT_BAD_WHEELHOUSE
