"""wheelhouse/index.html: the page a person reads, rendered from the validated manifest.

`render` is pure: every value it shows comes from the manifest (already validated field by
field), the coverage report published beside it (validated the same way) and the lock headers,
and goes through `html.escape`, so a manifest value holding markup is shown as text. The page
loads nothing from elsewhere (no fonts, no scripts: it has none) and works from file:// and
through `serve`. `write_page` is the edge: it gathers those facts and writes through the one
atomic write, whenever the index is rewritten.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.coverage import Report, parse_report
from builder.files import write_atomic
from builder.node import (
    CHECK_STATUSES,
    CONFIG_SITE,
    INSTALLER,
    MANIFEST_FILE,
    MODULE,
    NAMESPACE,
    SIGNATURE_FILE,
    ImageEntry,
    ManifestError,
    WheelEntry,
    WheelhouseManifest,
    check_wheel_name,
    config_category,
    config_matrix,
    describe_floor,
    dtypes_of,
    fingerprint_of,
    glibc_floor,
    module_version,
    op_table,
    read_bounded,
    split_variant_name,
    tag_machine,
)
from builder.results import STAGES, StageResult

PAGE = "index.html"
WH_PLACEHOLDER = "file:///path/to/this/wheelhouse"  # the page names no folder: a copy elsewhere stays valid
GENERATOR = '<meta name="generator" content="ds-wheel-builder">'  # how a page this toolkit wrote is told apart
TORCH_INDEX = "https://download.pytorch.org/whl"  # where a node without torch in the wheelhouse gets it
UV_VARIANTS = "uv 0.13.6 or newer, with --preview-features wheel-variants"

_STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:72rem;
padding:0 1rem 3rem;color:#1b1f23;background:#fff}
h1{font-size:1.6rem;margin:1.2rem 0 .3rem}h2{font-size:1.25rem;margin:2rem 0 .5rem;border-bottom:1px solid #ddd}
h3{font-size:1.05rem;margin:1.2rem 0 .4rem}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;margin:.4rem 0;font-size:.9rem}
th,td{border:1px solid #d0d7de;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f5f7}
code,pre{font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
p code{overflow-wrap:anywhere}
pre{background:#f6f8fa;border:1px solid #d0d7de;padding:.6rem;white-space:pre-wrap;word-break:break-all;margin:.3rem 0}
.passed{color:#116329}.failed{color:#a40e26;font-weight:600}.skipped,.reused{color:#7d4e00}
.note{color:#57606a;font-size:.9rem}
td.ok{background:#f0fff4}td.bad{background:#fff5f5;font-weight:600}td.skip{background:#fffbea}
td.op-yes{background:#f0fff4}td.op-no{background:#fff5f5}td.op-narrowed{background:#fffbea}
@media (max-width:40rem){body{font-size:14px;padding:0 .5rem 2rem}th,td{padding:.25rem .35rem}}
"""


@dataclass(frozen=True)
class PageFacts:
    manifest: WheelhouseManifest
    locks: Mapping[str, str]  # locks/<name>.lock -> the wheel it pins
    coverage: Report | None = None
    coverage_problem: str = ""  # why a published coverage report is not shown


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


_STATUS_WORDS = {"upstream": "DeepSpeed's own failure (not the wheel's)"}


def _status(status: str) -> str:
    return f'<span class="{_e(status)}">{_e(status)}</span>'


def _table(table_id: str, head: Sequence[str], rows: Sequence[str]) -> str:
    heads = "".join(f"<th>{_e(h)}</th>" for h in head)
    return (f'<div class="scroll"><table id="{_e(table_id)}"><thead><tr>{heads}</tr></thead>'
            f"<tbody>\n{chr(10).join(rows)}\n</tbody></table></div>")  # fmt: skip


def _code(value: object) -> str:
    return f"<code>{_e(value)}</code>"


def _row(attr: str, key: str, cells: Sequence[str]) -> str:
    """A table row found by data-<attr> (the tests and scripts look rows up by it); `cells` are HTML."""
    return f'<tr data-{attr}="{_e(key)}">' + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def _cmd(kind: str, wheel: str, text: str) -> str:
    return f'<pre class="cmd" data-kind="{_e(kind)}" data-wheel="{_e(wheel)}"><code>{_e(text)}</code></pre>'


def target_label(entry: WheelEntry) -> str:
    return f"{entry.recipe} / {entry.python_tag}"


def glibc_of(name: str) -> str:
    floor = glibc_floor(check_wheel_name(name).platform)
    return f"{floor[0]}.{floor[1]}" if floor else "any"


def machine_of(name: str) -> str:
    """The nodes a wheel is for (x86_64, aarch64: GH200/GB200), from its platform tag."""
    return tag_machine(check_wheel_name(name).platform) or "any"


def _floor_cell(name: str) -> str:
    """The glibc a wheel needs, with the systems that have it on hover (RHEL 8+, Debian 10+, ...)."""
    return f'<span title="{_e(describe_floor(check_wheel_name(name).platform))}">{_e(glibc_of(name))}</span>'


def torch_in_wheelhouse(manifest: WheelhouseManifest, entry: WheelEntry) -> bool:
    """Whether the wheelhouse holds the torch this wheel pins, for its Python (a lock adds it)."""
    for name in manifest.dependencies:
        wheel = check_wheel_name(name)
        if (
            wheel.project == "torch"
            and wheel.version.split("+")[0] == entry.torch.split("+")[0]
            and (wheel.python == entry.python_tag)
        ):
            return True
    return False


def variant_version(manifest: WheelhouseManifest, wheel: str) -> str | None:
    """The version the variant wheels of `wheel` carry (what `uv pip install deepspeed==V` names)."""
    for variant in manifest.variants.values():
        if variant.wheel == wheel and variant.properties:
            return split_variant_name(variant.name)[0].version
    return None


def install_commands(manifest: WheelhouseManifest, entry: WheelEntry) -> dict[str, str]:
    """kind -> the shell commands that install this wheel on a node, with the wheelhouse as $WH."""
    project = check_wheel_name(entry.name).project
    torch = ""
    if not torch_in_wheelhouse(manifest, entry):
        flavour = f"cu{''.join(entry.cuda.split('.')[:2])}" if entry.accelerator == "cuda" and entry.cuda else "cpu"
        torch = f'pip install "torch=={entry.torch.split("+")[0]}" --index-url {TORCH_INDEX}/{flavour}\n'
    pin = f'"{project}=={entry.version}"'
    out = {
        "pip": f'{torch}pip install --index-url "$WH/simple/" {pin}',
        "uv": f'{torch.replace("pip install", "uv pip install")}uv pip install --index-url "$WH/simple/" {pin}',
    }
    version = variant_version(manifest, entry.name)
    if version:
        out["uv-variants"] = (f'{torch.replace("pip install", "uv pip install")}uv pip install --preview-features '
                              f'wheel-variants --index-url "$WH/simple/" "{project}=={version}"')  # fmt: skip
    return out


KEY_PLACEHOLDER = "ssh-ed25519 AAAA...(the line python -m builder key show prints on the build host)"


def node_installer_command(manifest: WheelhouseManifest) -> str:
    """A node's checked path by hand: the manifest's signature verified with the build host's key,
    the installer checked against the sha256 that verified manifest lists, then run with the key
    (it checks the signature, expiry and serial again, and every file)."""
    key = manifest.signer or KEY_PLACEHOLDER
    sha = f"json.load(open('{MANIFEST_FILE}'))['tools']['{INSTALLER}']['sha256']"
    return (f"KEY='{key}'\n"
            f'cd "$(mktemp -d)" && \\\n'
            f'curl -fsSLO "$WH/{MANIFEST_FILE}" -O "$WH/{SIGNATURE_FILE}" -O "$WH/{INSTALLER}" && \\\n'
            f'echo "{NAMESPACE} $KEY" > trusted && \\\n'
            f"ssh-keygen -Y verify -f trusted -I {NAMESPACE} -n {NAMESPACE} -s {SIGNATURE_FILE} \\\n"
            f"  < {MANIFEST_FILE} && \\\n"
            f'python3 -c "import json; print({sha}, \' ds-node-install.py\')" | sha256sum -c - && \\\n'
            'python3 ds-node-install.py --wheelhouse "$WH" --trust "$KEY"')  # fmt: skip


def _targets(manifest: WheelhouseManifest) -> str:
    rows = [
        _row("wheel", name, [_code(name), *map(_e, (e.recipe, e.version.split("+")[0], e.torch, e.cuda or "none (cpu)",
             e.python_tag, machine_of(name), ", ".join(e.archs) or "cpu", e.cpu_target)), _floor_cell(name),
             _e(len(e.ops)),
             _smoke_cell(e), _proof_cell(e), _e(e.published_at)])
        for name, e in sorted(manifest.wheels.items())
    ]  # fmt: skip
    head = ["wheel", "recipe", "DeepSpeed", "torch", "CUDA", "Python", "machine", "GPU archs", "CPU target", "glibc >=",
            "ops", "smoke", "GPU proof", "published"]  # fmt: skip
    return _table("targets", head, rows)


def _proof_cell(e: WheelEntry) -> str:
    """Each GPU proof of a CUDA wheel, linked to its statement, or that it has none: a smoke on a build
    host with no GPU ran no CUDA kernel."""
    if e.accelerator != "cuda":
        return '<span class="proof">a CPU wheel: its smoke ran it</span>'
    if not e.proofs:
        return ('<span class="proof skipped">not proven on a GPU</span> (run <code>python -m builder prove</code> on a '
                "GPU node, then <code>publish --proof</code>)")  # fmt: skip
    return "<br>".join(f'<a class="proof" href="{_e(p.name)}">{_e(p.describe())}</a> <span class="proof-signer'
                       f'{"" if p.signer else " skipped"}">({_e(p.vouched())})</span>' for p in e.proofs)  # fmt: skip


def _smoke_cell(e: WheelEntry) -> str:
    """passed or failed, and where it passed with failures of DeepSpeed's own that the recipe lists, how
    many: "passed" alone hid them."""
    if not e.smoke.passed:
        return _status("failed")
    own = sum(1 for status, _ in e.smoke.checks.values() if status == "upstream")
    if not own:
        return _status("passed")
    return (f'{_status("passed")} <span class="upstream">with {own} known failure{"s" if own > 1 else ""} of '
            "DeepSpeed's own (see its checks)</span>")  # fmt: skip


_URL = re.compile(r"https?://[A-Za-z0-9._~:/?#\[\]@!$&*+,;=%-]{1,500}")


def _linked(text: str) -> str:
    """`text` escaped, each http(s) URL in it a link (a known failure's issue): its href escaped too."""
    out, at = [], 0
    for m in _URL.finditer(text):
        url = m[0].rstrip(".,;)")
        out.append(_e(text[at : m.start()]))
        out.append(f'<a href="{_e(url)}" rel="noopener noreferrer">{_e(url)}</a>')
        at = m.start() + len(url)
    out.append(_e(text[at:]))
    return "".join(out)


def op_cell(row: Mapping[str, str], archs: Sequence[str]) -> tuple[str, str]:
    """(css class, text) of one op of one wheel: built (and for which archs), missing and why."""
    if row["built"] != "yes":
        return "op-no", f"not built: {row['why']}"
    narrowed = row["archs"] not in ("cpu", ";".join(archs))
    text = f"built ({row['archs']})" if row["archs"] != "cpu" or archs else "built"
    if narrowed:
        text = f"built, narrowed to {row['archs']}"
    text += f"; load {row['loaded']}, numerics {row['checked']}"
    if row["why"]:
        text += f": {row['why']}"
    return ("op-narrowed" if narrowed else "op-yes"), text


def _ops(manifest: WheelhouseManifest) -> str:
    wheels = sorted(manifest.wheels.items())
    tables = {name: {r["op"]: r for r in op_table(e)} for name, e in wheels}
    ops = sorted({op for rows in tables.values() for op in rows})
    rows = []
    for op in ops:
        cells = []
        for name, e in wheels:
            row = tables[name].get(op)
            if row is None:
                cells.append(f'<td data-wheel="{_e(name)}" data-op="{_e(op)}" class="op-none">not asked</td>')
                continue
            css, text = op_cell(row, e.archs)
            cells.append(f'<td data-wheel="{_e(name)}" data-op="{_e(op)}" class="{css}">{_e(text)}</td>')
        rows.append(f'<tr data-op="{_e(op)}"><th>{_e(op)}</th>{"".join(cells)}</tr>')
    return _table("ops", ["op", *(target_label(e) for _, e in wheels)], rows)


def _checks(manifest: WheelhouseManifest) -> str:
    parts = []
    for name, e in sorted(manifest.wheels.items()):
        rows = [_row("check", check, [_e(check), _status(status), _linked(detail)])
                for check, (status, detail) in sorted(e.smoke.checks.items())]  # fmt: skip
        counts = {s: sum(1 for st, _ in e.smoke.checks.values() if st == s) for s in CHECK_STATUSES}
        summary = ", ".join(f"{n} {_STATUS_WORDS.get(s, s)}" for s, n in counts.items() if n)
        parts.append(f'<details data-wheel="{_e(name)}"><summary>{_e(target_label(e))}: {_e(summary)} '
                     f'(finished {_e(e.smoke.finished_at)})</summary>'
                     f'{_table("checks-" + name, ["check", "result", "reason"], rows)}</details>')  # fmt: skip
    return "\n".join(parts)


def _install(facts: PageFacts) -> str:
    m = facts.manifest
    parts = [
        "<p>Set <code>WH</code> to where the node reaches this wheelhouse: this folder as a file:// URL, or the "
        "address of <code>python -m builder serve</code> (or a web server serving this folder).</p>",
        _cmd("wh", "", f'WH="{WH_PLACEHOLDER}"    # or WH="http://BUILD-HOST:8000" while serve runs'),
        "<h3>Any node: the node installer picks the wheel that fits it (the checked path)</h3>",
        f"<p>{_signed(m)} Python, pip and ssh-keygen (OpenSSH 8.1+) only: the command checks the manifest's "
        "signature with the build host's key, the installer against the sha256 the signed manifest lists, and the "
        "installer checks every file, the expiry and that the serial never goes back. <strong>Take the key from the "
        "build host</strong> (<code>python -m builder key show</code>), not from this page: whoever can write this "
        "folder can edit the page. <code>python -m builder provision</code> writes scripts that do the same on "
        "every node with the key inside.</p>",
        _cmd("node-installer", "", node_installer_command(m)),
        "<h3>A shared software tree: an Lmod module, once for all nodes</h3>",
        "<p>On one node that mounts the site's software tree, after the checks above, as the tree's owner: the "
        "wheel that fits the node and everything its lock pins (torch included) go into a venv made with the "
        "Python you name (it must be at that path on every node), proven with Lmod, then its modulefile is written "
        "(the toolkit's docs/hpc.md). The module of each wheel is named below.</p>",
        _cmd(
            "module",
            "",
            'python3 ds-node-install.py --wheelhouse "$WH" --trust "$KEY" --module /shared/software '
            "--python /usr/bin/python3.11\n"
            "# users: module use /shared/software/modulefiles && module load deepspeed",
        ),
        '<p class="note">The pip and uv commands below check each file only against the sha256 in the index they '
        "are served, which lies in the same folder: use them where the folder itself is trusted, or install from a "
        "lock the node installer checked.</p>",
    ]
    for name, e in sorted(m.wheels.items()):
        gpu = f"GPUs {', '.join(e.archs)}" if e.archs else "no GPU needed"
        parts.append(f'<h3 data-wheel="{_e(name)}">{_e(e.recipe)} ({_e(e.python_tag)}, {_e(gpu)})</h3>')
        images = [i for i in m.images.values() if i.wheel == name]
        ways = [f"Lmod module <code>{_e(MODULE)}/{_e(module_version(e))}</code>"]
        ways += [f"CI image <code>{_e(i.name)}</code>" for i in images]
        ways += [f"Slurm container image <code>{_e(i.squashfs)}</code>" for i in images if i.squashfs]
        parts.append(f'<p class="note" data-ways="{_e(name)}">Also as: {", ".join(ways)}.</p>')
        for kind, text in install_commands(m, e).items():
            label = {"pip": "plain pip", "uv": "uv", "uv-variants": "uv, picking the build for the node's GPU "
                     "(experimental)"}[kind]  # fmt: skip
            parts.append(f'<p class="note">{_e(label)}</p>{_cmd(kind, name, text)}')
    return "\n".join(parts)


def _signed(m: WheelhouseManifest) -> str:
    if not m.signer:
        return '<span class="failed">This manifest is not signed.</span>'
    return (
        f"The manifest is signed by key <code>{_e(fingerprint_of(m.signer))}</code> (serial {m.serial}, valid "
        f"until {_e(m.expires)})."
    )


def _images(manifest: WheelhouseManifest) -> str:
    if not manifest.images:
        return '<p class="note">No CI image is published (<code>python -m builder image</code> makes one).</p>'

    def slurm(i: ImageEntry) -> str:
        if not i.squashfs:
            return "-"
        return (f"{_code(i.squashfs)} ({i.squashfs_size / 1e6:.0f} MB)<br>"
                + _code(f"srun --container-image=$WH_DIR/{i.squashfs} ..."))  # fmt: skip

    rows = [
        _row("image", name, [_code(name), _code(i.ref), _code(i.image_id[:12]), f"{i.size / 1e6:.0f} MB", _e(i.base),
             _e(i.lock), _code(i.wheel), _status("passed" if i.smoke.passed else "failed"),
             _code(f"podman load -i {name}"), slurm(i)])
        for name, i in sorted(manifest.images.items())
    ]  # fmt: skip
    heads = ["archive", "image", "ID", "size", "base", "lock", "wheel", "smoke inside", "load", "Slurm (squashfs)"]
    return _table("images", heads, rows)


def _locks(facts: PageFacts) -> str:
    if not facts.locks:
        return '<p class="note">No lock is written (<code>python -m builder lock</code> writes one).</p>'
    rows = [_row("lock", rel, [_code(rel), _code(wheel), "yes" if wheel in facts.manifest.wheels else "no (pruned)"])
            for rel, wheel in sorted(facts.locks.items())]  # fmt: skip
    return _table("locks", ["lock", "pins", "wheel published"], rows)


def _coverage(facts: PageFacts) -> str:
    if facts.coverage_problem:
        return f'<p class="failed">The published coverage report is not shown: {_e(facts.coverage_problem)}</p>'
    report = facts.coverage
    if report is None:
        return '<p class="note">No matrix run has published here (<code>build-wheel --matrix</code>).</p>'

    def stage_cell(s: StageResult) -> str:
        took = f" {s.seconds:.0f}s" if s.seconds >= 1 else ""
        return _status(s.status) + _e(took) + (f'<br><span class="note">{_e(s.reason)}</span>' if s.reason else "")

    rows = [
        _row("target", r.target, [_e(r.target), _e(r.python), *(stage_cell(report.stages[r.target][s]) for s in STAGES),
             _code(r.wheel or "-"), *(_e(v or "-") for v in (r.job, r.node, r.units_on, r.smoke_on))])
        for r in report.rows
    ]  # fmt: skip
    passed = len(report.rows) - len(report.failed)
    head = (f"<p>Matrix <code>{_e(report.matrix or 'build-wheel')}</code>, finished {_e(report.finished_at)}: "
            f"{passed} of {len(report.rows)} targets passed every stage they ran.</p>")  # fmt: skip
    return head + _table(
        "coverage", ["target", "python", *STAGES, "wheel", "slurm job", "node", "op units on", "smoked on"], rows
    )


def _variants(manifest: WheelhouseManifest) -> str:
    if not manifest.variants:
        return ('<p class="note">Not published (<code>publish --variants</code>). Wheel variants are experimental: '
                f"the draft PEPs 817 and 825, read by {_e(UV_VARIANTS)}.</p>")  # fmt: skip
    rows = [_row("variant", n, [_code(n), _e(v.label), _e("; ".join(v.properties) or "none: the fallback where no "
                 "other variant fits"), _code(v.wheel)]) for n, v in sorted(manifest.variants.items())]  # fmt: skip
    return (
        f"<p><strong>Experimental.</strong> Each CUDA wheel is also published as a variant wheel labelled by its "
        f"GPU archs and CUDA version (the draft PEPs 817 and 825), and one "
        f"<code>&lt;name&gt;-&lt;version&gt;-variants.json</code> per version. There is no fallback variant: a node "
        f"no variant fits (no GPU, an older GPU or driver) is told so instead of getting a build that cannot run "
        f"there. Installers that support them: "
        f"{_e(UV_VARIANTS)}. pip does not: it ignores variant files and installs the plain wheels as before.</p>"
        + _table("variants", ["variant wheel", "label", "properties", "built from"], rows)
    )


def _configs(manifest: WheelhouseManifest) -> str:
    """A grid per wheel: optimizer x offload rows, ZeRO stage columns, what the smoke found running
    that DeepSpeed config from the wheel (per dtype where the dtypes differ); then the site's configs."""
    parts = []
    for name, e in sorted(manifest.wheels.items()):
        grid = config_matrix(e.smoke.checks)
        rows = []
        for optimizer, cells in grid.items():
            dtypes = dtypes_of(cells)
            for offload in ("none", "cpu", "nvme"):
                if not any(o == offload for _, o, _ in cells):
                    continue
                tds = []
                for stage in range(4):
                    found = {d: cells[(stage, offload, d)] for d in dtypes if (stage, offload, d) in cells}
                    if not found:
                        tds.append('<td class="op-none">-</td>')
                        continue
                    kinds = set(found.values())
                    text = kinds.pop() if len(kinds) == 1 else "; ".join(f"{d}: {k}" for d, k in found.items())
                    css = "ok" if text == "runs" else ("bad" if "FAILED" in text else "skip")
                    tds.append(
                        f'<td class="{css}" data-config="{_e(optimizer)}/zero{stage}/{_e(offload)}">{_e(text)}</td>'
                    )
                rows.append(f"<tr><th>{_e(optimizer)}</th><td>{_e(offload)}</td>{''.join(tds)}</tr>")
        site = [_row("config", n, [_e(n[len(CONFIG_SITE):]), _status(st), _e(config_category(st, d)), _linked(d)])
                for n, (st, d) in sorted(e.smoke.checks.items()) if n.startswith(CONFIG_SITE)]  # fmt: skip
        if not rows and not site:
            continue
        table = _table("configs-" + name, ["optimizer", "offload", "ZeRO 0", "ZeRO 1", "ZeRO 2", "ZeRO 3"], rows)
        if site:
            table += _table("site-configs-" + name, ["site config", "result", "means", "detail"], site)
        parts.append(f'<details data-configs-of="{_e(name)}" open><summary>{_e(target_label(e))}</summary>{table}'
                     "</details>")  # fmt: skip
    return "\n".join(parts) or "<p>No wheel here ran the config matrix (smoked before it existed).</p>"


def render(facts: PageFacts) -> str:
    m = facts.manifest
    counts = ((len(m.wheels), "DeepSpeed wheel"), (len(m.dependencies), "dependency file"), (len(m.images), "CI image"),
              (len(m.variants), "variant wheel"))  # fmt: skip
    summary = ", ".join(f"{n} {what}{'' if n == 1 else 's'}" for n, what in counts)
    sections = [
        ("install", "Install on a node", _install(facts)),
        ("published", "Published targets", _targets(m)),
        ("op-grid", "Ops by target", _ops(m)),
        ("configs", "DeepSpeed configs from the wheel, no compiler", _configs(m)),
        ("smoke", "Smoke checks", _checks(m)),
        ("ci-images", "CI images", _images(m)),
        ("lock-files", "Locks", _locks(facts)),
        ("matrix", "Last matrix run", _coverage(facts)),
        ("wheel-variants", "Wheel variants by GPU arch", _variants(m)),
    ]
    body = "\n".join(f'<section id="{sid}"><h2>{_e(title)}</h2>\n{text}\n</section>' for sid, title, text in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"{GENERATOR}\n"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
        f"<title>DeepSpeed wheelhouse</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f'<h1>DeepSpeed wheelhouse</h1>\n<p id="summary">{_e(summary)}. Every value on this page comes from '
        f'<a href="manifest.json">manifest.json</a>; pip reads <a href="simple/">simple/</a>.</p>\n'
        f"{body}\n</body>\n</html>\n"
    )


def gather(wheelhouse: Path, manifest: WheelhouseManifest) -> PageFacts:
    """What the page shows, read from the wheelhouse: the coverage report only when its sha256 is
    the one the manifest lists."""
    from builder.files import sha256_of
    from builder.wheelhouse.layout import lock_headers

    report, problem = None, ""
    for name, entry in manifest.reports.items():
        path = wheelhouse / name
        try:
            if path.is_symlink() or sha256_of(path) != entry.sha256:
                problem = f"{name} is not the file the manifest lists (run `python -m builder verify`)"
                continue
            report = parse_report(json.loads(read_bounded(path, "report")), name)
        except (OSError, ValueError, ManifestError) as exc:
            problem = f"{name}: {getattr(exc, 'message', exc)}"
    return PageFacts(manifest, lock_headers(wheelhouse, manifest), report, problem)


def write_page(wheelhouse: Path, manifest: WheelhouseManifest) -> Path:
    """Write index.html; a page someone else put there (not one this toolkit wrote) is refused."""
    from builder.errors import PublishError

    path = wheelhouse / PAGE
    if path.exists() or path.is_symlink():
        head = b""
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                head = f.read(1024)
        if GENERATOR.encode() not in head:
            raise PublishError(f"{path} exists and is not the page this toolkit writes",
                               "move it away (the toolkit writes the wheelhouse's index.html itself)")  # fmt: skip
    return write_atomic(path, render(gather(wheelhouse, manifest)))
