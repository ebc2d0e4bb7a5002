"""bench --image: making the CI image of a published wheel, cold and again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builder import output
from builder.bench.common import _report, _timed
from builder.workspace import Workspace


def bench_image(wheelhouse: Path, out: Path) -> dict[str, Any]:
    """The CI image of the wheelhouse's newest wheel for this Python: cold (the toolkit's own
    debootstrap base removed from podman first, so it is made again) and rebuilt with that base
    cached; each with its steps' times. Nothing is published."""
    from builder import podman
    from builder.debian import host_mirror
    from builder.images.base import debootstrap_ref
    from builder.images.build import build_image

    out.mkdir(parents=True, exist_ok=True)
    ws = Workspace(out / "work-image")
    podman.require()
    podman.remove_image(debootstrap_ref(host_mirror()))  # the toolkit's own base, nobody else's
    output.step("bench: CI image, cold (the debootstrap base made anew)")
    cold_s, cold = _timed(lambda: build_image(wheelhouse, ws, publish=False))
    output.step("bench: CI image again, the base cached")
    warm_s, warm = _timed(lambda: build_image(wheelhouse, ws, publish=False))
    info = podman.inspect(warm.ref) or {}
    result = {
        "ref": warm.ref,
        "image_id": warm.image_id,
        "same_image": cold.image_id == warm.image_id,
        "image_bytes": info.get("Size"),
        "archive_bytes": warm.size,
        "seconds": {"cold": cold_s, "warm": warm_s},
        "steps": {"cold": cold.seconds, "warm": warm.seconds},
        "ratios": {"warm_vs_cold": warm_s / cold_s},
    }
    return _report(out / "bench-image", result, render_image(result))


def render_image(result: dict[str, Any]) -> str:
    s, st = result["seconds"], result["steps"]

    def steps(which: str) -> str:
        return ", ".join(f"{k} {v:.0f} s" for k, v in st[which].items())

    size = result["image_bytes"]
    return "\n".join([
        f"CI image `{result['ref']}` (ID {result['image_id'][:12]}; the same ID both times: {result['same_image']}):",
        "",
        "| measure | seconds | ratio |",
        "|---|---|---|",
        f"| cold: debootstrap base made, image built, smoked inside, saved ({steps('cold')}) | {s['cold']:.0f} s | |",
        f"| rebuild with the base cached ({steps('warm')}) | {s['warm']:.0f} s | "
        f"{result['ratios']['warm_vs_cold']:.2f} of cold |",
        f"| image size in podman / OCI archive | {size / 1e6 if isinstance(size, int) else 0:.0f} MB / "
        f"{result['archive_bytes'] / 1e6:.0f} MB | |",
        "",
    ])  # fmt: skip
