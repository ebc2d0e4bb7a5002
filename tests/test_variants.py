"""Wheel variants (issue 23, experimental): labels, the shared version, no null fallback (issue 28), the
variants.json file, verify/repair/prune, and the uv the toolkit pins choosing among them.

The two CUDA wheels here are FAKES (zips with the files publish reads and a payload naming the
arch; a second real CUDA build and smoke would add minutes to CI): everything else is real, the
variant wheels and index made by publish --variants, and uv 0.13.9 resolving them with its
built-in NVIDIA provider, the GPU and driver forced with NV_VARIANT_PROVIDER_FORCE_SM_ARCH and
NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION (no GPU here). test_cuda_pipeline makes the variants
of a real CUDA wheel and installs one with uv.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from fakes import BUILD, fake_wheel

from builder import node
from builder.envs import uv_binary
from builder.errors import WheelhouseError
from builder.files import sha256_of
from builder.node import ManifestError, WheelEntry, parse_manifest
from builder.wheelhouse import publish, verify
from builder.wheelhouse.layout import load_manifest
from builder.wheelhouse.page import PAGE, install_commands
from builder.wheelhouse.prune import prune
from builder.wheelhouse.upkeep import repair
from builder.wheelhouse.variants import label_of, plan, properties_of, shared_version

SHARED = "0.19.8+cu130.torch2.14"
CPU_NAME = "deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-linux_x86_64.whl"


def cuda_name(sm: str) -> str:
    return f"deepspeed-0.19.8+cu130.torch2.14.{sm}-cp311-cp311-linux_x86_64.whl"


def variant(label: str) -> str:
    return f"deepspeed-{SHARED}-cp311-cp311-linux_x86_64-{label}.whl"


def fake_cuda_wheel(folder: Path, sm: str, archs: list[str], recipe: str) -> Path:
    """A FAKE CUDA wheel: the files publish reads, and a payload saying which build it is."""
    version = f"0.19.8+cu130.torch2.14.{sm}"
    metadata = f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {version}\nRequires-Dist: torch==2.14.1\n"
    folder.mkdir(parents=True, exist_ok=True)
    return fake_wheel(folder, cuda_name(sm), payload=sm.encode(), metadata=metadata, accelerator="cuda",
                      archs=archs, torch={"version": "2.14.1+cu130", "cuda": "13.0"},
                      recipe={"name": recipe, "torch": "2.14.1"})  # fmt: skip


def _entry(archs: tuple[str, ...], version: str = "0.19.8+cu130.torch2.14.sm80", cuda: str = "13.0") -> WheelEntry:
    smoke = node.SmokeSummary(True, "", {"import": ("passed", "")})
    return WheelEntry(cuda_name("sm80"), "0" * 64, version, "r", "cuda", "cp311", "2.14.1", cuda, archs,
                      "x86-64-v3", (), ("fused_adam",), smoke)  # fmt: skip


def test_labels_properties_and_the_shared_version() -> None:
    assert properties_of(_entry(("8.0", "9.0+PTX", "9.0a"))) == (
        "nvidia :: cuda_version_lower_bound :: 13.0",
        "nvidia :: sm_arch :: 80_real",
        "nvidia :: sm_arch :: 90_real",
        "nvidia :: sm_arch :: 90_virtual",
    )
    assert properties_of(_entry(("9.0a",))) == ()  # arch-specific code: no provider value, no variant
    assert shared_version("0.19.8+cu130.torch2.14.sm80.sm90ptx") == SHARED
    assert shared_version("0.19.8+cpu.torch2.13") == "0.19.8+cpu.torch2.13"
    assert label_of(_entry(("8.0", "9.0"), "0.19.8+cu130.torch2.14.sm80.sm90")) == "cu130_sm80.sm90"
    wheels = {
        cuda_name("sm80"): _entry(("8.0",)),
        cuda_name("sm90"): dataclasses.replace(
            _entry(("9.0",)), name=cuda_name("sm90"), version="0.19.8+cu130.torch2.14.sm90"
        ),
    }
    planned = plan(wheels)
    # No null fallback: uv takes it exactly where no other variant fits, and no CUDA build runs there
    # (an sm_90-only fallback went to sm_86, sm_70, no-GPU and CUDA 12.8-driver nodes).
    assert sorted(planned) == [variant("cu130_sm80"), variant("cu130_sm90")]
    assert plan({cuda_name("sm90"): wheels[cuda_name("sm90")]}).keys() == {variant("cu130_sm90")}


@pytest.fixture
def house(tmp_path: Path) -> Path:
    house = tmp_path / "house"
    (tmp_path / "c").mkdir()
    wheels = [
        fake_cuda_wheel(tmp_path / "a", "sm80", ["8.0"], "cu130-ampere"),
        fake_cuda_wheel(tmp_path / "b", "sm90", ["9.0"], "cu130-hopper"),
        fake_wheel(tmp_path / "c", CPU_NAME),
    ]
    publish(wheels, house, variants=True)
    return house


def test_publish_variants_makes_wheels_an_index_file_and_links_them(house: Path) -> None:
    manifest = load_manifest(house)
    assert sorted(manifest.variants) == [variant("cu130_sm80"), variant("cu130_sm90")]
    assert list(manifest.variant_indexes) == [f"deepspeed-{SHARED}-variants.json"]
    doc = json.loads((house / f"deepspeed-{SHARED}-variants.json").read_text())
    assert doc["$schema"] == "https://variants-schema.wheelnext.dev/peps/825/v0.1.1.json"
    assert doc["variants"] == {
        "cu130_sm80": {"nvidia": {"cuda_version_lower_bound": ["13.0"], "sm_arch": ["80_real"]}},
        "cu130_sm90": {"nvidia": {"cuda_version_lower_bound": ["13.0"], "sm_arch": ["90_real"]}},
    }
    with zipfile.ZipFile(house / variant("cu130_sm90")) as zf:
        names = zf.namelist()
        inside = json.loads(zf.read(f"deepspeed-{SHARED}.dist-info/variant.json"))
        assert zf.read("deepspeed/payload") == b"sm90"
        assert f"Version: {SHARED}" in zf.read(f"deepspeed-{SHARED}.dist-info/METADATA").decode()
    assert list(inside["variants"]) == ["cu130_sm90"] and not any(".sm90.dist-info" in n for n in names)
    page = (house / "simple" / "deepspeed" / "index.html").read_text()
    for name in [*manifest.variants, *manifest.variant_indexes]:
        assert f"{name.replace('+', '%2B')}#sha256={manifest.file_sha256(name)}" in page
    assert verify(house) == []
    assert (house / variant("cu130_sm90")).stat().st_mode & 0o777 == 0o644
    # The page says it is experimental and gives the uv command for the shared version.
    text = (house / PAGE).read_text()
    assert "<strong>Experimental.</strong>" in text and "uv 0.13.6 or newer" in text
    commands = install_commands(manifest, manifest.wheels[cuda_name("sm90")])
    assert commands["uv-variants"].endswith(
        f'uv pip install --preview-features wheel-variants --index-url "$WH/simple/" "deepspeed=={SHARED}"'
    )
    # Re-publishing changes nothing; publishing without --variants keeps them in step.
    before = {n: sha256_of(house / n) for n in manifest.variants}
    publish([], house)
    assert {n: sha256_of(house / n) for n in load_manifest(house).variants} == before


def _uv_install(house: Path, venv: Path, env: dict[str, str], spec: str, variants: bool = True) -> str:
    """uv pip install SPEC from the wheelhouse's index only; the label of the variant it installed."""
    uv = uv_binary(venv.parent / "tools")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NV_VARIANT", "UV_", "PIP_"))}
    preview = ["--preview-features", "wheel-variants"] if variants else []
    done = subprocess.run(
        [uv, "pip", "install", "--python", str(venv / "bin" / "python"), "--no-deps", "--reinstall", "--no-cache",
         *preview, "--index-url", (house / "simple").as_uri() + "/", spec],
        capture_output=True, text=True, env={**clean, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (info,) = site.glob("deepspeed-*.dist-info")
    payload = (site / "deepspeed" / "payload").read_text()
    label = json.loads((info / "variant.json").read_text())["variants"] if (info / "variant.json").is_file() else {}
    return f"{','.join(label) or 'plain'}:{payload}"


@pytest.mark.spawns
def test_uv_picks_the_build_for_the_nodes_gpu_and_pip_keeps_the_plain_wheels(house: Path, tmp_path: Path) -> None:
    venv = tmp_path / "node"
    subprocess.run([uv_binary(tmp_path / "tools"), "venv", "-q", "-p", sys.executable, str(venv)], check=True)
    driver = {"NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION": "13.0"}
    spec = f"deepspeed=={SHARED}"
    assert _uv_install(house, venv, {**driver, "NV_VARIANT_PROVIDER_FORCE_SM_ARCH": "9.0"}, spec) == "cu130_sm90:sm90"
    assert _uv_install(house, venv, {**driver, "NV_VARIANT_PROVIDER_FORCE_SM_ARCH": "8.0"}, spec) == "cu130_sm80:sm80"
    assert _uv_install(house, venv, {**driver, "NV_VARIANT_PROVIDER_FORCE_SM_ARCH": "8.6"}, spec) == "cu130_sm80:sm80"
    # Where no variant fits (no GPU, an older GPU, a driver older than CUDA 13.0), uv installs nothing
    # and says so, instead of a build that cannot run there.
    old_driver = {"NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION": "12.8", "NV_VARIANT_PROVIDER_FORCE_SM_ARCH": "9.0"}
    volta = {**driver, "NV_VARIANT_PROVIDER_FORCE_SM_ARCH": "7.0"}
    for env in ({}, old_driver, volta):
        with pytest.raises(AssertionError) as refused:
            _uv_install(house, venv, env, spec)
        assert f"{SHARED} has only unsupported wheel variants" in " ".join(str(refused.value).split())
    # Without the preview flag, uv and pip see only the plain wheels, exactly as before.
    plain = "deepspeed==0.19.8+cu130.torch2.14.sm90"
    assert _uv_install(house, venv, {}, plain, variants=False) == "plain:sm90"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp_path / "pip"), "--index-url",
         (house / "simple").as_uri() + "/", plain],
        capture_output=True, text=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-2000:]
    assert [p.name for p in (tmp_path / "pip").iterdir()] == [cuda_name("sm90")]


def test_verify_repair_and_prune_keep_variants_true_to_their_wheels(house: Path) -> None:
    index = house / f"deepspeed-{SHARED}-variants.json"
    good = index.read_text()
    index.write_text(good.replace("90_real", "100_real"))
    assert f"{index.name}: sha256 differs from manifest.json (tampered or replaced)" in verify(house)
    # A variant whose bytes were swapped for other ones, with the manifest edited to match.
    evil = house / variant("cu130_sm90")
    with zipfile.ZipFile(evil, "a") as zf:
        zf.writestr("deepspeed/extra.py", "import os\n")
    signed = (house / "manifest.json").read_text()
    data = json.loads(signed)
    data["variants"][evil.name]["sha256"] = sha256_of(evil)
    (house / "manifest.json").write_text(json.dumps(data))
    problems = verify(house)
    assert f"{evil.name}: not the variant of {cuda_name('sm90')} (its files or variant.json differ)" in problems
    assert any("manifest.json.sig does not match what it signs" in p for p in problems)
    with pytest.raises(WheelhouseError, match="does not match what it signs"):
        repair(house)  # repair never builds on a manifest its key did not sign
    # Variant files are derived: with the signed manifest back, repair makes them again from the wheels.
    (house / "manifest.json").write_text(signed)
    repair(house)
    assert verify(house) == [] and index.read_text() == good
    # Pruning the sm80 wheel removes its variant.
    removed = prune(house, ["cu130-hopper", "cpu"], [])
    assert cuda_name("sm80") in removed and variant("cu130_sm80") in removed
    manifest = load_manifest(house)
    assert sorted(manifest.variants) == [variant("cu130_sm90")]
    assert not (house / variant("cu130_sm80")).exists() and verify(house) == []
    assert "cu130_sm80" not in index.read_text()


def test_a_killed_publish_of_variants_is_cleaned_and_a_file_not_ours_is_never_replaced(
    house: Path, tmp_path: Path
) -> None:
    # A variant file a killed publish wrote (the journal names it with its hash): removed next time.
    stray = house / variant("cu130_sm75")
    stray.write_bytes(b"half")
    (house / ".publish-journal.json").write_text(json.dumps({"files": {stray.name: sha256_of(stray)}}))
    publish([], house)
    assert not stray.exists() and verify(house) == []
    # A journal naming a path out of the wheelhouse under a variant-like name: nothing is removed.
    outside = house.parent / "x-1-py3-none-any-a.whl"
    outside.write_bytes(b"keep")
    journal = {"files": {"../x-1-py3-none-any-a.whl": sha256_of(outside)}}
    (house / ".publish-journal.json").write_text(json.dumps(journal))
    publish([], house)
    assert outside.read_bytes() == b"keep" and verify(house) == []
    # A file the toolkit did not write, under a name a variant would take: refused, left alone.
    mine = fake_cuda_wheel(tmp_path / "d", "sm86", ["8.6"], "cu130-ada")
    planted = house / variant("cu130_sm86")
    planted.write_bytes(b"someone else's")
    with pytest.raises(Exception, match="is not a variant file a publish wrote"):
        publish([mine], house)
    assert planted.read_bytes() == b"someone else's" and cuda_name("sm86") not in load_manifest(house).wheels


def test_a_hostile_variant_entry_is_refused(house: Path) -> None:
    data = json.loads((house / "manifest.json").read_text())
    good = data["variants"][variant("cu130_sm90")]
    cases = [
        ({"../x-1-py3-none-any-a.whl": good}, "is not a wheel file name"),
        ({variant("cu130_sm90"): {**good, "label": "cu130_sm80"}}, "but the file name says"),
        ({variant("null"): {**good, "label": "null"}}, "must be empty for the null variant"),
        ({variant("cu130_sm90"): {**good, "wheel": CPU_NAME.replace("cpu.torch2.13", "x")}}, "which no wheel entry"),
        ({variant("cu130_sm90"): {**good, "properties": ["<script>"]}}, "holds an invalid item"),
        ({variant("cu130_sm90").replace("cu130_sm90", "CU130<b>"): good}, "no valid variant label"),
        ({variant("cu130_sm90").replace("linux_x86_64", "linux_aarch64"): good}, "another project or platform"),
    ]  # fmt: skip
    for table, message in cases:
        with pytest.raises(ManifestError, match=message):
            parse_manifest(json.dumps({**data, "variants": table}))
    with pytest.raises(ManifestError, match="has no deepspeed-0.19.8"):
        parse_manifest(json.dumps({**data, "variant_indexes": {}}))
    with pytest.raises(ManifestError, match="is not a <name>-<version>-variants.json name"):
        parse_manifest(json.dumps({**data, "variant_indexes": {"../../etc/passwd": {"sha256": "0" * 64}}}))
    assert BUILD["accelerator"] == "cpu"  # the fakes' defaults were not changed by the CUDA fakes
