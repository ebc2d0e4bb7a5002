"""`install --module`: a venv in a site's shared software tree with everything the lock pins, and
the Lmod modulefile that loads it, proven in a login shell before it is published.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from builder.node.choosing import describe_floor, tag_machine
from builder.node.contract import SHA256_RE, InstallError, ManifestError
from builder.node.entries import WheelEntry, WheelhouseManifest
from builder.node.fetch import download
from builder.node.files import (
    open_regular,
    printable,
    say,
)
from builder.node.names import check_wheel_name, normalize
from builder.node.paths import folder_problem
from builder.node.pip import pip_fix, run_pip

#
# A site's shared software tree gets the wheel with everything its lock pins (torch included) in a
# venv made with the node's Python, and a Lua modulefile for Lmod pointing at it. The venv's folder
# is named for the lock (a second install of the same lock is a no-op; another lock gets its own
# folder), and the modulefile is written last, in one rename: users see the old module or the new
# one, never a half-installed one, and jobs still running from the old folder keep their files.

EXIT_MODULE = 16  # the module cannot be installed where asked (see ModuleError)
MODULE = "deepspeed"
MODULE_MARK = "-- deepspeed module, written by ds-wheel-builder"  # a modulefile's first line: ours
MODULE_RECORD = "ds-module.json"  # in the venv's folder, written last: the install is complete
MODULE_PARTIAL = ".ds-module-partial"  # in a venv folder being made: a leftover this installer may remove
LMOD_INITS = ("/usr/share/lmod/lmod/init/bash", "/opt/apps/lmod/lmod/init/bash", "/usr/local/lmod/lmod/init/bash")
# Folders of the system (and everything below the trees): no folder the toolkit writes may be one.
_LOCK_REQ = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)\s*\\?$")
_LOCK_HASH = re.compile(r"^\s*--hash=sha256:(?P<digest>[0-9a-f]{64})\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ModuleError(InstallError):
    """The module cannot be installed where asked: the prefix or modulefile folder is unsafe or
    not writable, another lock's module holds that version, Lmod or venv is missing, or the module
    does not load and list its ops."""

    exit_code = EXIT_MODULE


def parse_lock(text: str, where: str) -> "tuple[str, dict[str, str]]":
    """The wheel a lock was written for (its first line) and its pins: requirement -> sha256. Only
    `name==version` lines, each with its hash: no option (--find-links, --index-url), path or URL.
    ValueError names the file and the line."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# Lock for "):
        raise ValueError(f"{where} is not a lock written by `lock` (no '# Lock for' line)")
    wheel = lines[0][len("# Lock for ") :].split(",")[0]
    pins: dict[str, str] = {}
    pending: str | None = None
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        req, digest = _LOCK_REQ.match(line.strip()), _LOCK_HASH.match(line)
        if pending is None and req:
            pending = f"{normalize(req['name'])}=={req['version']}"
        elif pending is not None and digest:
            pins[pending] = digest["digest"]
            pending = None
        else:
            raise ValueError(f"{where}, line {number}: {line.strip()[:80]!r} is not a pinned requirement with its hash")
    if pending is not None or not pins:
        raise ValueError(f"{where} pins {f'{pending} without a hash' if pending is not None else 'no file'}")
    return wheel, pins


def module_version(entry: "WheelEntry") -> str:
    """The module's version: the wheel's, and its Python (one lock per wheel, one wheel per Python), and the
    machine where it is not x86_64 (a software tree both x86_64 and GH200 nodes mount holds both modules)."""
    machine = tag_machine(check_wheel_name(entry.name).platform)
    suffix = f"-{machine}" if machine and machine != "x86_64" else ""
    return f"{entry.version}-py{entry.python_tag[2]}.{entry.python_tag[3:]}{suffix}"


def _lua(text: str) -> str:
    """A Lua string literal of `text` (paths and names the installer checked: no control characters)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _lua_long(text: str) -> str:
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    return f"[{'=' * level}[\n{text}\n]{'=' * level}]"


def render_modulefile(entry: "WheelEntry", root: str, lock: str, lock_sha256: str, python: str) -> str:
    """The Lua modulefile of one installed lock (pure). It only sets the environment: nothing is
    written at load, and `module unload` (or purge) undoes every line."""
    version = module_version(entry)
    py = f"{entry.python_tag[2]}.{entry.python_tag[3:]}"
    ops = ", ".join(entry.ops) or "none"
    archs = ", ".join(entry.archs) or "-"
    helptext = (
        f"DeepSpeed {entry.version} for Python {py} with torch {entry.torch}, its ops prebuilt: nothing is\n"
        f"compiled at first use, and no compiler is needed.\n"
        f"  ops: {ops}\n"
        f"  accelerator: {entry.accelerator}; GPU archs: {archs}\n"
        f"  needs {describe_floor(check_wheel_name(entry.name).platform)}\n"
        f"  installed from {lock} (sha256 {lock_sha256}), every file checked by sha256\n"
        f"  files: {root} (Python: {python})"
    )
    return "\n".join([
        MODULE_MARK,
        f"-- {MODULE}/{version}: {entry.name}",
        f"-- lock: {lock} sha256 {lock_sha256}",
        "-- Installing another lock at this version writes a new folder, then replaces this file in one rename.",
        f"local root = {_lua(root)}",
        'whatis("Name: DeepSpeed")',
        f"whatis({_lua('Version: ' + entry.version)})",
        f"whatis({_lua(f'Python {py}, torch {entry.torch}, accelerator {entry.accelerator}')})",
        f"whatis({_lua('Prebuilt ops: ' + ops)})",
        f"help({_lua_long(helptext)})",
        f'conflict("{MODULE}")',
        'prepend_path("PATH", pathJoin(root, "bin"))',
        'setenv("VIRTUAL_ENV", root)',
        'setenv("PYTHONNOUSERSITE", "1")  -- packages in ~/.local do not shadow the module\'s',
        "",
    ])  # fmt: skip


def modulefile_lock(path: str) -> "str | None":
    """The lock sha256 a modulefile of ours names; None where there is none. ModuleError where the
    file is not ours (never replaced) or not a regular file."""
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
        raise ModuleError(f"{path} is not a regular file (a link, a folder, a device): it is not a modulefile this "
                          "installer wrote", "move it away, or install into another --modulefiles folder")  # fmt: skip
    if not os.path.exists(path):
        return None
    with open_regular(path) as f:
        text = f.read(64 << 10).decode("utf-8", errors="replace")
    lines = text.splitlines()
    found = [line for line in lines[:4] if line.startswith("-- lock: ")]
    if not lines or lines[0] != MODULE_MARK or not found:
        raise ModuleError(f"{path} exists and was not written by this installer", "move it away (it is not ours "
                          "to replace), or install into another --modulefiles folder")  # fmt: skip
    digest = found[0].rsplit(" ", 1)[-1]
    return digest if SHA256_RE.match(digest) else None


def check_module_folders(prefix: str, modulefiles: str) -> None:
    """The prefix and the modulefile folder are safe and writable, or ModuleError says why (each shown
    escaped: a newline in a --prefix printed a line of its own)."""
    for what, folder in (("--module prefix", prefix), ("modulefile folder", modulefiles),
                         ("modulefile folder", os.path.join(modulefiles, MODULE))):  # fmt: skip
        shown = printable(folder)
        why = folder_problem(folder, written_into_files=True)
        if why:
            raise ModuleError(f"the {what} {shown} is unsafe: {why}", "install into a folder for site software "
                              "that root or you own, e.g. /shared/software, with --modulefiles beside it")  # fmt: skip
        existing = os.path.abspath(folder)
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
            raise ModuleError(f"the {what} {shown} cannot be written by this user ({printable(existing)} is not a "
                              "writable folder)", "run as the user who owns the site's software tree, or name a "
                              "folder this user may write")  # fmt: skip


def find_lmod(env: "Mapping[str, str]") -> str:
    """Lmod's bash init script (LMOD_PKG's, else where distributions put it)."""
    pkg = env.get("LMOD_PKG", "")
    for path in ([os.path.join(pkg, "init", "bash")] if pkg else []) + list(LMOD_INITS):
        if os.path.isfile(path):
            return path
    raise ModuleError(f"Lmod is not installed here (no {' or '.join(LMOD_INITS[:1])}, LMOD_PKG unset): the module "
                      "is loaded with Lmod before it is published", "install Lmod (Debian/Ubuntu: apt-get install "
                      "lmod; RHEL: dnf install Lmod), or set LMOD_PKG to its folder")  # fmt: skip


def clean_env(env: "Mapping[str, str]") -> "dict[str, str]":
    """The environment pip and venv run in for a module: none of this user's pip settings (an index,
    find-links), Python path or user site, so the module holds the lock's files and nothing else; file
    times fixed (SOURCE_DATE_EPOCH), so byte-compiled files are the same on every install."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")
    kept = {k: v for k, v in env.items() if not k.startswith("PIP_") and k not in dropped}
    return {**kept, "SOURCE_DATE_EPOCH": "0", "PIP_CONFIG_FILE": os.devnull, "PYTHONNOUSERSITE": "1"}


def _make_folder(path: str) -> None:
    """mkdir -p with 0755 whatever the umask: the tree is read by every user, written by its owner."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:
            continue
        os.chmod(folder, 0o755)


def _read_only_for_others(root: str) -> None:
    """Every file readable by all, nothing writable but by its owner (pip honours the umask only)."""
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                continue
            mode = os.lstat(path).st_mode & 0o7777
            want = (mode | 0o444 | (0o111 if mode & 0o100 or name in dirs else 0)) & ~0o022
            if want != mode:
                os.chmod(path, want)
    os.chmod(root, 0o755)


def _write_file(path: str, data: str) -> None:
    """Write `path` in one rename, readable by all (a modulefile users may be loading right now)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def prove_module(modulefiles: str, version: str, entry: "WheelEntry", root: str, tmp: str) -> "list[str]":
    """Load the module with Lmod in a clean shell whose home is an empty folder, as a user would;
    its python must be the module's and ds_report must list every op of the wheel [YES]. The lines
    it checked."""
    init = find_lmod(os.environ)
    home = os.path.join(tmp, "home")
    os.makedirs(home, exist_ok=True)
    script = ('. "$0" && module use "$1" && module load "$2" && python -c "import sys, deepspeed; print(\'prefix=\' '
              '+ sys.prefix)" && ds_report')  # fmt: skip
    env = {"HOME": home, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "USER": "ds-module-check",
           "TMPDIR": tmp}  # fmt: skip
    done = subprocess.run(["bash", "--noprofile", "--norc", "-c", script, init, modulefiles, f"{MODULE}/{version}"],
                          capture_output=True, env=env, timeout=600)  # fmt: skip
    said = _ANSI.sub("", (done.stdout + done.stderr).decode("utf-8", errors="replace"))
    lines = said.splitlines()
    prefixes = [line[len("prefix=") :] for line in lines if line.startswith("prefix=")]
    if done.returncode != 0 or [os.path.realpath(p) for p in prefixes] != [os.path.realpath(root)]:
        raise ModuleError(f"{MODULE}/{version} did not load and run with Lmod (exit {done.returncode}): "
                          f"{' | '.join(lines[-4:])[-600:]}", "nothing was published; fix what it says and "
                          "install again")  # fmt: skip
    installed = {}
    for line in lines:
        m = re.match(r"^([a-z0-9_]+)\s*\.{3,}\s*\[(YES|NO)\]", line.strip())
        if m:
            installed[m.group(1)] = m.group(2)
    missing = [op for op in entry.ops if installed.get(op) != "YES"]
    if missing:
        raise ModuleError(f"ds_report under {MODULE}/{version} does not list {', '.join(missing)} as installed "
                          "[YES]", "the wheel's ops did not load from the module's files: read ds_report's output "
                          f"({' | '.join(lines[-3:])[-300:]})")  # fmt: skip
    written = sorted(os.listdir(home))
    if written:
        raise ModuleError(f"loading {MODULE}/{version} and running it wrote into the user's home: "
                          f"{', '.join(written[:5])}", "nothing was published; read the modulefile and report "
                          "this")  # fmt: skip
    return [f"python {prefixes[0]}/bin/python"] + [f"{op} [YES]" for op in entry.ops]


def missing_end(path: str) -> str:
    """The absolute path a chain of links from `path` ends at where it is missing (a venv's
    bin/python -> python3.11 -> /usr/bin/python3.11): the file the node lacks, not a link's text."""
    for _ in range(40):
        if not os.path.islink(path):
            return path
        target = os.readlink(path)
        path = os.path.normpath(os.path.join(os.path.dirname(path), target))
    return path


def module_runs_here(root: str) -> str:
    """Why the module's venv does not run on this node ("" where it does): its python (a link to the
    interpreter it was made with, on the node that made it) missing here, or failing to import
    DeepSpeed. A shared tree is read by nodes of several OSes: a module made on a Debian 12 host with
    /usr/bin/python3.11 answered "already installed" on a Debian 11 node that has no such file."""
    python = os.path.join(root, "bin", "python")
    if not os.path.exists(python):  # a dangling link: its interpreter is not on this node
        return f"its python is {printable(missing_end(python))}, which this node does not have"
    try:
        done = subprocess.run([python, "-c", "import deepspeed"], capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"its python {python} does not start here ({exc})"
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        return (
            f"its python {python} cannot import DeepSpeed here ({printable(said[-1])[:200] if said else 'no output'})"
        )
    return ""


def install_module(base: str, manifest: "WheelhouseManifest", entry: "WheelEntry", python: str, prefix: str,
                   modulefiles: str, replace: bool, dry_run: bool, tmp: str) -> "dict[str, Any]":  # fmt: skip
    """The chosen wheel and its lock's files, checked, installed as an Lmod module (see above)."""
    prefix, modulefiles = os.path.abspath(prefix), os.path.abspath(modulefiles)
    check_module_folders(prefix, modulefiles)
    version = module_version(entry)
    locks = {}
    for rel, listed in sorted(manifest.locks.items()):
        if not rel.endswith(".lock"):
            continue
        os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)  # locks/<name>.lock, checked names
        path, digest = download(base, rel, "report", tmp, listed.size)
        if digest != listed.sha256:
            raise ManifestError(f"{rel} from {base} has sha256 {digest}, the manifest says {listed.sha256}",
                                "the wheelhouse copy is damaged or was tampered with: run `python -m builder "
                                "verify` on it")  # fmt: skip
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        try:
            wheel, pins = parse_lock(text, rel)
        except ValueError as exc:
            raise ManifestError(str(exc), "write the lock again on the build host: python -m builder lock") from exc
        if wheel == entry.name:
            locks[rel] = (path, digest, pins)
    if not locks:
        raise ModuleError(f"the wheelhouse has no lock for {entry.name}: a module holds the wheel with everything "
                          "its lock pins (torch included)", f"on the build host: python -m builder lock --wheel "
                          f"{entry.name}")  # fmt: skip
    lock = sorted(locks)[0]
    lock_path, lock_sha, pins = locks[lock]
    served = {e.sha256: n for n, e in list(manifest.wheels.items()) + list(manifest.dependencies.items())}
    missing = [req for req, digest in sorted(pins.items()) if digest not in served]
    if missing:
        raise ManifestError(f"{lock} pins {len(missing)} file(s) the wheelhouse does not serve: "
                            f"{', '.join(missing[:5])}", "write the lock again on the build host: python -m "
                            f"builder lock --wheel {entry.name}")  # fmt: skip
    root = os.path.join(prefix, MODULE, version, lock_sha[:12])
    modulefile = os.path.join(modulefiles, MODULE, f"{version}.lua")
    result = {"module": f"{MODULE}/{version}", "modulefile": modulefile, "root": root, "lock": lock,
              "lock_sha256": lock_sha, "installed": False}  # fmt: skip
    current = modulefile_lock(modulefile)
    done = os.path.isfile(os.path.join(root, MODULE_RECORD))
    if current == lock_sha and done:
        why = module_runs_here(root)
        if why:
            raise ModuleError(f"{MODULE}/{version} is installed from {lock}, but it does not run on this node: {why}",
                              "a module's venv runs the Python it was made with, at that path: install a module per "
                              "interpreter path (another --prefix and --modulefiles for these nodes, made here with "
                              f"--python {python}), or put that Python at the same path on every node")  # fmt: skip
        say(f"==> {MODULE}/{version} is already installed from {lock} (sha256 {lock_sha[:16]}...): nothing to do")
        say(f"==> installed {entry.name}")  # in place: what provision reads
        return {**result, "installed": True, "unchanged": True}
    if current is not None and current != lock_sha and not replace:
        raise ModuleError(f"{modulefile} is the module of another lock at version {version} (sha256 {current[:16]}..."
                          f", not {lock_sha[:16]}...)", "pass --replace-module to switch it to this lock (its old "
                          "folder stays for jobs still using it), or publish the change as a new version")  # fmt: skip
    say(f"==> module {MODULE}/{version}: {len(pins)} files of {lock}, into {root}; modulefile {modulefile}")
    if dry_run:
        return result
    started = time.monotonic()
    _make_folder(os.path.dirname(root))
    if os.path.exists(root) and not done:
        if not os.path.isfile(os.path.join(root, MODULE_PARTIAL)):
            raise ModuleError(f"{root} exists and was not made by this installer", "move it away; it is not ours")
        say(f"    removing {root}: an install that was interrupted")
        shutil.rmtree(root)
    made = not done
    try:
        if made:
            _make_folder(root)
            with open(os.path.join(root, MODULE_PARTIAL), "w", encoding="utf-8") as f:
                f.write(f"being installed by pid {os.getpid()}\n")
            files = os.path.join(tmp, "files")
            os.makedirs(files)
            for digest in sorted(pins.values()):
                name = served[digest]
                size = manifest.wheels[name].size if name in manifest.wheels else manifest.dependencies[name].size
                _, got = download(base, name, "wheel", files, size)
                if got != digest:
                    raise ManifestError(f"{name} from {base} has sha256 {got}, {lock} and the manifest say {digest}",
                                        "the wheelhouse copy is damaged or was tampered with: run `python -m "
                                        "builder verify` on it")  # fmt: skip
            say(f"==> {len(pins)} files of {lock} verified by sha256; making the venv with {python}")
            old = os.umask(0o022)
            try:
                venv = subprocess.run([python, "-m", "venv", root], capture_output=True, text=True, check=False,
                                      env=clean_env(os.environ))  # fmt: skip
                if venv.returncode != 0:
                    raise ModuleError(f"{python} -m venv failed: {venv.stderr.strip()[-400:]}",
                                      f"install venv for {python} (Debian/Ubuntu: apt-get install python3-venv), "
                                      "or pass --python with one that has it")  # fmt: skip
                env = clean_env(os.environ)
                cmd = [os.path.join(root, "bin", "python"), "-m", "pip", "install", "--no-index", "--no-cache-dir",
                       "--disable-pip-version-check", "--require-hashes", "--find-links", files, "-r",
                       lock_path]  # fmt: skip
                say(f"+ {' '.join(cmd)}")
                code, said = run_pip(cmd, env)
                if code != 0:
                    raise ModuleError(f"pip could not install {lock} into {root} (exit {code})",
                                      pip_fix(said, python, entry))  # fmt: skip
            finally:
                os.umask(old)
            shutil.copyfile(lock_path, os.path.join(root, "ds-module.lock"))
            _read_only_for_others(root)
        proof_dir = os.path.join(tmp, "modulefiles")
        os.makedirs(os.path.join(proof_dir, MODULE))
        text = render_modulefile(entry, root, lock, lock_sha, python)
        with open(os.path.join(proof_dir, MODULE, f"{version}.lua"), "w", encoding="utf-8") as f:
            f.write(text)
        checked = prove_module(proof_dir, version, entry, root, tmp)
        say(f"==> {MODULE}/{version} loads with Lmod: {'; '.join(checked)}")
        if made:
            record = {"module": f"{MODULE}/{version}", "wheel": entry.name, "lock": lock, "lock_sha256": lock_sha,
                      "python": python, "files": {served[d]: d for d in pins.values()}}  # fmt: skip
            _write_file(os.path.join(root, MODULE_RECORD), json.dumps(record, indent=1, sort_keys=True) + "\n")
            os.unlink(os.path.join(root, MODULE_PARTIAL))
    except BaseException:
        if made and os.path.isfile(os.path.join(root, MODULE_PARTIAL)):
            shutil.rmtree(root, ignore_errors=True)  # ours, half-made: nothing points at it
        raise
    _make_folder(os.path.dirname(modulefile))
    _write_file(modulefile, text)  # last: from here on users load the new one
    size = sum(os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(root) for n in names)
    say(
        f"==> published {MODULE}/{version}: {modulefile} -> {root} ({size / 1e6:.0f} MB, "
        f"{time.monotonic() - started:.0f} s); users run: module use {modulefiles} && module load {MODULE}/{version}"
    )
    say(f"==> installed {entry.name}")
    return {**result, "installed": True, "size": size, "checked": checked}
