"""Installing on a node: the verified manifest, the chosen wheel and its dependencies checked by
sha256, installed with pip from those files only, then the DeepSpeed configs it was asked to run.
"""

import datetime
import hashlib
import json
import os
import shutil
import subprocess
import time
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

from builder.node.choosing import Node, choose, describe_floor, narrowed_for, proofs_for, unproven
from builder.node.contract import CONFIG_CHECK, EXIT_CONFIGS, MANIFEST_FILE, InstallError, ManifestError
from builder.node.entries import ImageEntry, WheelEntry, WheelhouseManifest
from builder.node.fetch import Verified, download, fetch, unlisted_projects, wheelhouse_base
from builder.node.files import say, scratch_dir
from builder.node.manifest import embedded_build_manifest, entry_differences, parse_manifest
from builder.node.module import MODULE, install_module, module_version
from builder.node.names import check_wheel_name
from builder.node.pip import check_pip, pip_fix, run_pip
from builder.node.probe import probe_node
from builder.node.state import (
    check_serial,
    check_source,
    read_serials,
    read_sources,
    remember_serial,
    source_key,
    state_dir,
)
from builder.node.tables import config_category, format_configs, format_op_rows, op_table
from builder.node.trust import SIGNATURE_FILE, SKIP_FLAG, Signature, Trust, no_key
from builder.node.verify import check_signature, check_statement


def _signed_manifest(base: str, trust: "Trust | None", where: str) -> "tuple[bytes, Signature | None]":
    """manifest.json's bytes, checked against manifest.json.sig when the node trusts a key. A publish
    renames the manifest and then its signature: a check that fails is tried again (up to three
    times, half a second apart) only while either file is changing."""
    data = fetch(base, MANIFEST_FILE)
    if trust is None:
        return data, None
    sig_where = f"{base.rstrip('/')}/{SIGNATURE_FILE}"
    for attempt in range(3):
        try:
            text = fetch(base, SIGNATURE_FILE, "signature")
        except InstallError as exc:
            missing = "HTTP 404" in exc.message or "No such file" in exc.message
            if isinstance(exc, ManifestError) or not missing:
                raise
            raise ManifestError(f"{where} is not signed: the wheelhouse has no {SIGNATURE_FILE}, and this node "
                                "installs only from signed wheelhouses (it was given a key)",
                                "publish with this toolkit (every write signs the manifest), or re-sign on the "
                                "build host: `python -m builder sign`; an unsigned copy may have been put in its "
                                "place") from exc  # fmt: skip
        try:
            return data, check_signature(data, text, trust, sig_where)
        except ManifestError:
            if attempt == 2:
                raise
            time.sleep(0.5)
            again = fetch(base, MANIFEST_FILE)
            if again == data and fetch(base, SIGNATURE_FILE, "signature") == text:
                raise
            data = again
    raise AssertionError("unreachable")


def load_wheelhouse(base: str) -> "WheelhouseManifest":
    """The validated manifest of a wheelhouse, its signature not checked (see load_verified)."""
    return load_verified(base, None).manifest


def load_verified(
    base: str, trust: "Trust | None", now: "datetime.datetime | None" = None, expected_id: "str | None" = None
) -> "Verified":
    """The validated manifest of a wheelhouse whose index lists nothing the manifest does not; with
    `trust`, only after its signature checks out, and only if it is signed, fresh and not older
    than what this node accepted before (the caller records it once installed)."""
    where = f"{base.rstrip('/')}/{MANIFEST_FILE}"
    data, sig = _signed_manifest(base, trust, where)
    manifest = parse_manifest(data, where)
    digest = hashlib.sha256(data).hexdigest()
    if sig is not None:
        check_statement(manifest, sig, where, now or datetime.datetime.now(datetime.timezone.utc))
        check_serial(manifest, digest, read_serials(state_dir(os.environ)), where)
        check_source(manifest, source_key(base), read_sources(state_dir(os.environ)), where, expected_id)
    try:
        root = fetch(base, "simple/index.html", "index page").decode("utf-8")
    except (InstallError, UnicodeDecodeError) as exc:
        raise ManifestError(f"the wheelhouse's simple/index.html cannot be read: {exc}", "re-publish it") from exc
    extra = unlisted_projects(root, manifest)
    if extra:
        raise ManifestError(
            f"simple/index.html of {base} links projects the manifest does not list: {', '.join(extra)[:300]}",
            "someone added them to the index: run `python -m builder verify` on the wheelhouse",
        )
    return Verified(manifest, digest, sig)


def checked_wheel(base: str, entry: "WheelEntry", folder: str) -> str:
    """The wheel downloaded into `folder`, after its sha256 and its embedded build manifest agree
    with the entry; its path."""
    path, digest = download(base, entry.name, "wheel", folder, entry.size)
    if digest != entry.sha256:
        raise ManifestError(
            f"{entry.name} from {base} has sha256 {digest}, the manifest says {entry.sha256}",
            "the wheelhouse copy is damaged or was tampered with: run `python -m builder verify` on it",
        )
    try:
        with zipfile.ZipFile(path) as zf:
            build = embedded_build_manifest(zf, entry.name)
    except zipfile.BadZipFile as exc:
        raise ManifestError(f"{entry.name} is not a zip file", "re-publish it") from exc
    differ = entry_differences(entry, build)
    if differ:
        raise ManifestError(
            f"manifest.json disagrees with {entry.name}'s own build manifest:\n    " + "\n    ".join(differ),
            "manifest.json was edited: run `python -m builder verify` on the wheelhouse and re-publish",
        )
    return path


def checked_dependencies(base: str, manifest: "WheelhouseManifest", entry: "WheelEntry", folder: str) -> "list[str]":
    """The dependency files the wheel installs with, downloaded into `folder`, each checked against
    its manifest sha256; their names."""
    if entry.requires is None:
        raise ManifestError(
            f"manifest.json does not say which dependency files {entry.name} needs (published by an older toolkit)",
            "publish any wheel into the wheelhouse again with this toolkit: it records them for every wheel",
        )
    for name in entry.requires:
        _, digest = download(base, name, "wheel", folder, manifest.dependencies[name].size)
        want = manifest.dependencies[name].sha256
        if digest != want:
            raise ManifestError(
                f"{name} from {base} has sha256 {digest}, the manifest says {want}",
                "the wheelhouse copy is damaged or was tampered with: run `python -m builder verify` on it",
            )
    return list(entry.requires)


def hashed_requirements(files: "Mapping[str, str]") -> str:
    """A pip requirements file pinning every file (name -> sha256) by version and hash: in pip's
    hash-checking mode nothing else can be installed, from anywhere."""
    lines = []
    for name, digest in sorted(files.items()):
        wheel = check_wheel_name(name)
        lines.append(f"{wheel.project}=={wheel.version} --hash=sha256:{digest}")
    return "\n".join(lines) + "\n"


def images_of(manifest: "WheelhouseManifest", wheel: str) -> "list[ImageEntry]":
    """The published CI images holding this wheel, newest first."""
    found = [i for i in manifest.images.values() if i.wheel == wheel]
    return sorted(found, key=lambda i: (i.published_at, i.name), reverse=True)


def install(
    wheelhouse: str,
    python: str,
    dry_run: bool = False,
    pip_args: "Sequence[str]" = (),
    trust: "Trust | None" = None,
    ops: "Sequence[str]" = (),
    skip_signature_check: bool = False,
    wheelhouse_id: "str | None" = None,
    module: "str | None" = None,
    modulefiles: "str | None" = None,
    replace_module: bool = False,
    require_gpu_proof: bool = False,
) -> "dict[str, Any]":
    """Pick, fetch, check and pip-install the wheel for this node, with its dependencies from the
    wheelhouse alone (hash-checked; no index is asked); returns what was done. With `trust`, the
    manifest is read only after its signature, expiry and serial check out. With `module` (a
    prefix), the wheel and its lock go into an Lmod module there instead (install_module)."""
    base = wheelhouse_base(wheelhouse)
    if trust is None and not skip_signature_check:
        raise no_key()
    verified = load_verified(base, trust, expected_id=wheelhouse_id)
    manifest = verified.manifest
    if verified.signature is None:
        say(
            f"warning: {SKIP_FLAG}: the manifest's signature is not checked, so whoever can write the "
            "wheelhouse decides what is installed (give the build host's key: `python -m builder key show`)"
        )
    else:
        say(f"==> manifest signed by {verified.signature.key.fingerprint()}: serial {manifest.serial}, valid "
            f"until {manifest.expires}")  # fmt: skip
    node = probe_node(python)
    say(f"==> node: {node.describe()}")
    entry = choose(manifest, node, ops)
    say(f"==> chosen: {entry.name} (torch {entry.torch}, archs {', '.join(entry.archs) or '-'}, "
        f"ops {', '.join(entry.ops)})")  # fmt: skip
    floor = describe_floor(check_wheel_name(entry.name).platform)
    say(f"    needs {floor}")
    for line in narrowed_for(entry, node):
        say(f"warning: {line}")
    proven = gpu_proofs(base, entry, node, require_gpu_proof)
    table = op_table(entry)
    for line in format_op_rows(table):
        say(f"    {line}")
    for line in format_configs(entry.smoke.checks):
        say(f"    {line}")
    tmp = scratch_dir("ds-install-")
    try:
        if module is None:
            done = _fetch_and_install(base, manifest, entry, node, verified, python, dry_run, pip_args, floor, table,
                                      tmp)  # fmt: skip
            return {**done, "gpu_proofs": proven}
        checked_wheel(base, entry, tmp)
        _accept(base, manifest, verified)
        folder = modulefiles or os.path.join(module, "modulefiles")
        done = install_module(base, manifest, entry, python, module, folder, replace_module, dry_run, tmp)
        return {"wheel": entry.name, "sha256": entry.sha256, "node": node.to_json(), "floor": floor,
                "gpu_proofs": proven, **done}  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


SHOWN_PROOFS = 3


def gpu_proofs(base: str, entry: "WheelEntry", node: "Node", required: bool) -> "list[str]":
    """The GPU proofs of a CUDA wheel this node relies on, printed; with `required`, InstallError where
    one of the node's compute capabilities has none (a wheel compiled where no GPU is, never run on one)."""
    proven = proofs_for(entry, node)
    for proof in proven[:SHOWN_PROOFS]:  # the newest: an install printed a line for each of 1000 once
        say(f"==> GPU proof: {proof.describe()}, {proof.vouched()} ({proof.name}, sha256 {proof.sha256[:16]}...)")
    if len(proven) > SHOWN_PROOFS:
        say(f"    and {len(proven) - SHOWN_PROOFS} older proofs of these GPUs (the wheelhouse's page lists them)")
    missing = unproven(entry, node)
    if missing and required:
        others = "; it has proofs for " + ", ".join(sorted({c for p in entry.proofs for c in p.capabilities})) if (
            entry.proofs) else ""  # fmt: skip
        raise InstallError(f"{entry.name} has no GPU proof for this node's compute capability {', '.join(missing)} "
                           f"(--require-gpu-proof){others}",
                           f"prove it on a node with such a GPU: `python -m builder prove --wheelhouse {base}` there; "
                           "then, on the build host, `python -m builder publish --proof <wheel>.proof.json`; or "
                           "install without --require-gpu-proof")  # fmt: skip
    if missing:
        say(f"warning: {entry.name} is not proven on a GPU of compute capability {', '.join(missing)}: no CUDA kernel "
            "of it was run by the toolkit on such a GPU (--require-gpu-proof refuses it)")  # fmt: skip
    return [p.name for p in proven]


def _accept(base: str, manifest: "WheelhouseManifest", verified: "Verified") -> None:
    """A manifest accepted (a dry run too): an older one is refused from now on."""
    if verified.signature is not None:
        remember_serial(state_dir(os.environ), manifest, verified.digest, verified.signature, source_key(base))


def _fetch_and_install(base: str, manifest: "WheelhouseManifest", entry: "WheelEntry", node: "Node",
                       verified: "Verified", python: str, dry_run: bool, pip_args: "Sequence[str]", floor: str,
                       table: "Any", tmp: str) -> "dict[str, Any]":  # fmt: skip
    """The chosen wheel and its dependencies downloaded into `tmp` and checked, then pip-installed
    from there alone (unless a dry run)."""
    checked_wheel(base, entry, tmp)
    deps = checked_dependencies(base, manifest, entry, tmp)
    say(f"==> {entry.name}: sha256 {entry.sha256[:16]}... verified, build manifest agrees; "
        f"{len(deps)} dependency wheels verified")  # fmt: skip
    images = images_of(manifest, entry.name)
    for image in images:
        smoke = "passed" if image.smoke.passed else "FAILED"
        say(f"==> CI image of this wheel: {image.name} ({image.ref}, ID {image.image_id[:12]}, "
            f"{image.size / 1e6:.0f} MB; smoke {smoke}): podman load -i <wheelhouse>/{image.name}")  # fmt: skip
        if image.squashfs:
            say(f"==> Slurm container image of this wheel: {image.squashfs} ({image.squashfs_size / 1e6:.0f} MB, "
                f"Enroot's layout): srun --container-image=<wheelhouse>/{image.squashfs} ...")  # fmt: skip
    result = {"wheel": entry.name, "sha256": entry.sha256, "node": node.to_json(), "installed": False, "floor": floor,
              "dependencies": sorted(deps), "ops_without_code_for_this_gpu": narrowed_for(entry, node),
              "missing_ops": dict(entry.missing_ops), "op_table": table,
              "configs": {n[len("config:"):]: {"status": s, "means": config_category(s, d), "detail": d}
                          for n, (s, d) in sorted(entry.smoke.checks.items()) if n.startswith("config:")},
              "images": [{"name": i.name, "ref": i.ref, "image_id": i.image_id, "digest": i.digest, "size": i.size,
                          **({"squashfs": i.squashfs, "squashfs_size": i.squashfs_size} if i.squashfs else {})}
                         for i in images],
              "module": f"{MODULE}/{module_version(entry)}"}  # fmt: skip
    say(
        f"==> as an Lmod module: {MODULE}/{module_version(entry)} (install it once on a shared tree: add "
        "--module PREFIX)"
    )
    _accept(base, manifest, verified)
    if verified.signature is not None:
        result["signed_by"] = verified.signature.key.fingerprint()
        result["serial"] = manifest.serial
    if dry_run:
        return result
    check_pip(python)
    pins = {entry.name: entry.sha256, **{n: manifest.dependencies[n].sha256 for n in deps}}
    requirements = os.path.join(tmp, "requirements.txt")
    with open(requirements, "w", encoding="utf-8") as f:
        f.write(hashed_requirements(pins))
    # Only the checked files: no index (an air-gapped node has none), pip's hash-checking mode.
    cmd = [python, "-m", "pip", "install", "--no-index", "--find-links", tmp, "--require-hashes",
           *pip_args, "-r", requirements]  # fmt: skip
    say(f"+ {' '.join(cmd)}")
    code, said = run_pip(cmd)
    if code != 0:
        raise InstallError(f"pip could not install {entry.name} (exit {code})", pip_fix(said, python, entry))
    say(f"==> installed {entry.name}")
    return {**result, "installed": True}


def check_configs(base: str, manifest: "WheelhouseManifest", python: str, files: "Sequence[str]",
                  timeout: float = 180.0) -> "tuple[int, list[dict[str, Any]]]":  # fmt: skip
    """Run `files` (DeepSpeed configs) against the DeepSpeed installed for `python`, with the
    wheelhouse's config checker, checked against the sha256 of the manifest (verified before)."""
    tool = manifest.tools.get(CONFIG_CHECK)
    if tool is None:
        raise InstallError(f"the wheelhouse publishes no config checker ({CONFIG_CHECK})",
                           "publish into it with a toolkit that has check-config")  # fmt: skip
    data = fetch(base, CONFIG_CHECK, "tool")
    digest = hashlib.sha256(data).hexdigest()
    if digest != tool.sha256:
        raise ManifestError(f"{CONFIG_CHECK} from {base} has sha256 {digest}, the manifest says {tool.sha256}",
                            "the wheelhouse copy is damaged or was tampered with: run `verify` on it")  # fmt: skip
    folder = scratch_dir("ds-config-check-")
    try:
        script = os.path.join(folder, "ds-config-check.py")
        with open(script, "wb") as f:
            f.write(data)
        ext = os.path.join(folder, "torch_extensions")
        os.mkdir(ext)
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": ext}
        cmd = [python, script, "--json", "--timeout", str(timeout), *[os.path.abspath(f) for f in files]]
        say(f"+ {' '.join(cmd)}")
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=folder, check=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        results = json.loads(done.stdout)
    except ValueError:
        raise InstallError(f"the config checker exited {done.returncode} without a report",
                           "read its output above; is DeepSpeed installed for this Python?") from None  # fmt: skip
    for r in results:
        say(f"config {r['status']:14} {r['name']}: {r.get('means', '')}")
    return (0 if all(r.get("status") == "passed" for r in results) else EXIT_CONFIGS), results
