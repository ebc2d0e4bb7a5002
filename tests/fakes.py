"""FAKE wheels for wheelhouse tests: zips holding only what publish, verify and install read.

They are not DeepSpeed builds (the integration tests make real ones); they carry a complete,
valid build manifest and METADATA, and a smoke report bound to their bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import stat
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from builder.contracts import Check, SmokeReport
from builder.files import sha256_of
from builder.smoke import report_path

NAME = "deepspeed-0.19.8+cpu.torch2.13-cp311-cp311-linux_x86_64.whl"
BUILD: dict[str, Any] = {
    "schema": 1,
    "version": "0.19.8+cpu.torch2.13",
    "recipe": {"name": "cpu", "torch": "2.13.0"},
    "source": {"sha256": "9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af"},
    "accelerator": "cpu",
    "python_tag": "cp311",
    "torch": {"version": "2.13.0+cpu", "cuda": None},
    "archs": [],
    "cpu_target": "x86-64-v3",
    "cpu_flags": [],
    "ops": ["cpu_adam"],
}


METADATA = "Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8+cpu.torch2.13\nRequires-Dist: torch==2.13.0\n"


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.append(dict(attrs)["href"] or "")


def links(html: str) -> list[str]:
    parser = Links()
    parser.feed(html)
    return parser.hrefs


def fake_wheel(
    folder: Path,
    name: str = NAME,
    payload: bytes = b"x",
    passed: bool | None = True,
    metadata: str = METADATA,
    **build: Any,
) -> Path:
    """A FAKE wheel: a zip holding only the embedded build manifest and METADATA, plus its smoke report."""
    wheel = folder / name
    version = name.split("-")[1]
    build_manifest = json.dumps({**BUILD, "version": version, **build})
    write_wheel(wheel, {f"deepspeed-{version}.dist-info/ds_builder.json": build_manifest.encode(),
                        f"deepspeed-{version}.dist-info/METADATA": metadata.encode(),
                        "deepspeed/payload": payload})  # fmt: skip
    if passed is not None:
        status = "passed" if passed else "failed"
        report = SmokeReport(
            wheel.name, sha256_of(wheel), passed, (Check("import", status),), 1.0, "2026-11-23T00:00:00+00:00"
        )
        report_path(wheel).write_text(report.to_json())
    return wheel


def write_wheel(wheel: Path, files: dict[str, bytes], executable: tuple[str, ...] = ()) -> Path:
    """A zip pip can install: `files` plus the dist-info's WHEEL and a RECORD with every hash;
    `executable` files get mode 0755 (a script pip installs as a program)."""
    name, version, python, abi, platform = wheel.name.removesuffix(".whl").split("-")
    dist_info = f"{name}-{version}.dist-info"
    files = {**files, f"{dist_info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: fakes\nRoot-Is-Purelib: true\n"
             f"Tag: {python}-{abi}-{platform}\n".encode()}  # fmt: skip
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | (0o755 if path in executable else 0o644)) << 16
            zf.writestr(info, data)
        zf.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel


def dep_wheel(
    folder: Path, project: str, version: str, requires: tuple[str, ...] = (), tag: str = "py3-none-any"
) -> Path:
    """A FAKE dependency wheel (pure Python, one module) that pip really installs."""
    module = project.replace("-", "_")
    meta = f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    return write_wheel(folder / f"{module}-{version}-{tag}.whl",
                       {f"{module}.py": f"VERSION = {version!r}\n".encode(),
                        f"{module}-{version}.dist-info/METADATA": meta.encode()})  # fmt: skip


def default_recipe_text(name: str = "cpu.toml") -> str:
    """A shipped recipe without its `configs` (config files named relative to its folder, which a
    copy elsewhere would not find; and a copy with other ops would not serve them), for tests that
    write a changed copy."""
    import re

    text = (Path(__file__).resolve().parent.parent / "recipes" / name).read_text()
    return re.sub(r"(?ms)^configs = \[.*?^\]\n", "", text)


def host_platform(text: str) -> str:
    """A recipe's text made to build for the build host's own OS (platform = "host", no [root]): the
    CUDA recipes name pypa's manylinux_2_28 image as their root (torch 2.14's headers need gcc 11+,
    which the toolkit's Debian 11 root lacks), and no registry is reachable from these machines."""
    import re

    text = re.sub(r'(?m)^platform = "[^"]*"', 'platform = "host"', text)
    return re.sub(r"(?ms)^\[root\]\n.*?(?=^\[|\Z)", "", text)


# ---------------------------------------------------------------- a stand-in for PyTorch's index

CPU_TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"  # this machine's local CPU torch


def local_cpu_torch() -> Path | None:
    """This machine's CPU torch wheel, from pip's find-links (None where it has none)."""
    import urllib.parse

    from builder import envs

    for folder in envs.pip_sources().find_links:
        path = Path(urllib.parse.urlparse(folder).path if "://" in folder else folder) / CPU_TORCH
        if path.is_file():
            return path
    return None


def pytorch_like_index(root: Path, wheel: Path) -> str:
    """A local folder index standing in for PyTorch's /whl/cpu (none of its hosts is reachable here):
    root/whl/cpu/torch/index.html linking the real wheel as PyTorch's pages do (%2B, #sha256=)."""
    import urllib.parse

    files = root / "whl" / "files"
    files.mkdir(parents=True)
    (files / wheel.name).symlink_to(wheel)
    page = root / "whl" / "cpu" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    href = f"../../files/{urllib.parse.quote(wheel.name)}#sha256={sha256_of(wheel)}"
    page.write_text(f'<!DOCTYPE html><html><body>\n<a href="{href}">{wheel.name}</a>\n</body></html>\n')
    return (root / "whl" / "cpu").as_uri()


def sign_offline(folder: Path) -> None:
    """offline.json in `folder` signed as gather signs it, by this test run's own key (a record a test
    writes by hand is then judged on what it says, after its signature)."""
    from builder import offline, signing

    text = (folder / offline.RECORD).read_bytes()
    (folder / offline.SIGNATURE).write_bytes(signing.sign(text, offline.NAMESPACE))


def raiser(where: str, kind: type[BaseException]) -> Any:
    """A function raising `kind` with its message from a frame of the FAKE file `where`
    (site-packages/<where>), as the code living there raises it: blame is judged by that frame."""
    import os

    namespace: dict[str, Any] = {}
    exec(compile(f"def _raise(message):\n    raise {kind.__name__}(message)\n",
                 os.path.join("site-packages", where), "exec"), {kind.__name__: kind}, namespace)  # fmt: skip
    return namespace["_raise"]
