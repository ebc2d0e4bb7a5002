"""What the page and the installer show of a wheel: its ops by status and architecture, and the
DeepSpeed configs it was proven with, as a matrix.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from builder.node.contract import ARCH_RE, OP_RE
from builder.node.entries import WheelEntry
from builder.node.fields import Fields


def arch_table(f: "Fields", key: str) -> "dict[str, tuple[str, ...]]":
    """An optional {op: [arch, ...]} field, every name and arch checked."""
    table = f.table(key, optional=True)
    inner = Fields(table, f"{f.where}.{key}")
    for op in table:
        if not OP_RE.match(op):
            raise f.fail(key, f"holds an invalid op name {op[:80]!r}")
    return {op: inner.texts(op, ARCH_RE) for op in table}


def reason_table(f: "Fields", key: str) -> "dict[str, str]":
    """An optional {op: why} field: valid op names, reasons of text."""
    table = f.table(key, optional=True)
    for op, why in table.items():
        if not OP_RE.match(op):
            raise f.fail(key, f"holds an invalid op name {op[:80]!r}")
        if not isinstance(why, str) or len(why) > 4000:
            raise f.fail(key, f"says of {op} something that is not a short text")
    return dict(table)


def op_rows(
    ops: "Sequence[str]",
    missing: "Mapping[str, str]",
    archs: "Sequence[str]",
    narrowed: "Mapping[str, Sequence[str]]",
    checks: "Mapping[str, tuple[str, str]]",
    host_ops: "Sequence[str]" = (),
) -> "list[dict[str, str]]":
    """One row per op the recipe asked for: built or why not, the archs its code holds, and what
    the smoke found when loading it and checking what it computes (`checks`: name -> (status, detail))."""
    rows = []
    for op in sorted({*ops, *missing}):
        if op in missing:
            rows.append({"op": op, "built": "no", "archs": "-", "loaded": "-", "checked": "-", "why": missing[op]})
            continue
        held = () if op in host_ops else narrowed.get(op, archs)
        load = checks.get(f"load:{op}", ("not run", ""))
        check = checks.get(f"numerics:{op}", ("not run", "no check of what it computes"))
        why = check[1] if check[0] != "passed" else ""
        if load[0] not in ("passed", "not run"):
            why = load[1]
        rows.append({"op": op, "built": "yes", "archs": ";".join(held) or "cpu", "loaded": load[0],
                     "checked": check[0], "why": why})  # fmt: skip
    return rows


def op_table(entry: "WheelEntry") -> "list[dict[str, str]]":
    """The op rows of a published wheel, from its manifest entry and its smoke summary."""
    return op_rows(entry.ops, entry.missing_ops, entry.archs, entry.narrowed_ops, entry.smoke.checks,
                   entry.host_ops or ())  # fmt: skip


def format_op_rows(rows: "Sequence[Mapping[str, str]]") -> "list[str]":
    """The op table as aligned text lines (install --dry-run, build-wheel)."""
    lines = []
    for row in rows:
        why = f"  ({shorten(row['why'], 300)})" if row["why"] else ""
        lines.append(f"op {row['op']:24} built {row['built']:3} archs {row['archs']:10} loaded {row['loaded']:8} "
                     f"checked {row['checked']}{why}")  # fmt: skip
    return lines


CONFIG_MATRIX = "config:matrix/"
CONFIG_SITE = "config:site/"
_OFFLOAD = {"none": "", "cpu": " + CPU offload", "nvme": " + NVMe offload"}
_DTYPE_ORDER = {"fp32": 0, "fp16": 1, "bf16": 2}


def dtypes_of(cells: "Mapping[tuple[int, str, str], str]") -> "list[str]":
    """The dtypes of a config grid, fp32 first."""
    return sorted({d for _, _, d in cells}, key=lambda d: (_DTYPE_ORDER.get(d, 9), d))


def config_category(status: str, detail: str) -> str:
    """What a config check says, in a word or three (the page's grid, install --dry-run)."""
    if status == "passed":
        return "runs"
    if status == "failed":
        return "FAILED"
    if status == "upstream":
        return "fails in DeepSpeed itself"
    if detail.startswith("needs op "):
        return "needs " + detail[len("needs op ") :].split(", which")[0]
    if detail.startswith("not supported by DeepSpeed"):
        return "not supported by DeepSpeed"
    if detail.startswith("torch.compile (inductor) compiles code"):  # config_check.outcome.NEEDS_COMPILER
        return "needs a compiler (torch.compile)"
    if detail.startswith("no GPU visible"):
        return "not run (no GPU)"
    return "skipped"


# The smoke's matrix optimizers in the order people read them (builder.configs runs these).
CONFIG_OPTIMIZERS = ("Adam", "AdamW", "Adagrad", "Lion", "Lamb", "Muon")
_OFFLOAD_ORDER = {"none": 0, "cpu": 1, "nvme": 2}


def _config_order(name: str) -> "tuple[Any, ...]":
    parts = name[len(CONFIG_MATRIX) :].split("/")
    if len(parts) != 4:
        return (99, name)
    optimizer, zero, offload, dtype = parts
    rank = CONFIG_OPTIMIZERS.index(optimizer) if optimizer in CONFIG_OPTIMIZERS else len(CONFIG_OPTIMIZERS)
    return (rank, optimizer, zero, _OFFLOAD_ORDER.get(offload, 9), _DTYPE_ORDER.get(dtype, 9), name)


def config_matrix(checks: "Mapping[str, tuple[str, str]]") -> "dict[str, dict[tuple[int, str, str], str]]":
    """optimizer -> (ZeRO stage, offload, dtype) -> category, from the smoke's matrix checks, in one
    order whatever order the checks come in (the page must render the same from any copy)."""
    grid: dict[str, dict[tuple[int, str, str], str]] = {}
    for name in sorted((n for n in checks if n.startswith(CONFIG_MATRIX)), key=_config_order):
        status, detail = checks[name]
        if not name.startswith(CONFIG_MATRIX):
            continue
        parts = name[len(CONFIG_MATRIX) :].split("/")
        if len(parts) != 4 or not parts[1].startswith("zero") or not parts[1][4:].isdigit():
            continue
        optimizer, zero, offload, dtype = parts
        grid.setdefault(optimizer, {})[(int(zero[4:]), offload, dtype)] = config_category(status, detail)
    return grid


def _stages(stages: "Sequence[int]") -> str:
    ordered = sorted(stages)
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"ZeRO {ordered[0]}-{ordered[-1]}"
    return "ZeRO " + ",".join(map(str, ordered))


def format_configs(checks: "Mapping[str, tuple[str, str]]") -> "list[str]":
    """The config matrix collapsed to a line per optimizer, then one per site config:
    `Adam: runs ZeRO 1-3 + CPU offload; needs fused_adam: ZeRO 0-3`."""
    lines = []
    for optimizer, cells in config_matrix(checks).items():
        dtypes = dtypes_of(cells)
        by_category: dict[str, dict[tuple[str, tuple[str, ...]], list[int]]] = {}
        for (stage, offload, _dtype), category in sorted(cells.items()):
            same = tuple(d for d in dtypes if cells.get((stage, offload, d)) == category)
            group = by_category.setdefault(category, {}).setdefault((offload, same), [])
            if stage not in group:
                group.append(stage)
        parts = []
        for category, groups in by_category.items():
            where = []
            for (offload, same), stages in groups.items():
                only = f" ({', '.join(same)})" if list(same) != dtypes else ""
                where.append(f"{_stages(stages)}{_OFFLOAD.get(offload, ' + ' + offload)}{only}")
            parts.append(f"{category}: {', '.join(dict.fromkeys(where))}")
        lines.append(f"config {optimizer:8} " + "; ".join(parts))
    for name, (status, detail) in sorted(checks.items()):
        if name.startswith(CONFIG_SITE):
            lines.append(
                f"config {name[len(CONFIG_SITE) :]}: {config_category(status, detail)} ({shorten(detail, 200)})"
            )
    return lines


def shorten(text: str, width: int) -> str:
    """`text` on one line, cut at a word (never mid-word) with " ..." where it is longer than `width`."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    return flat[: width - 4].rsplit(" ", 1)[0] + " ..."


def host_ops_of(build: "Mapping[str, Any]") -> "list[str] | None":
    """The ops of a GPU build with no device code in their .so (the build manifest's op_archs)."""
    op_archs = build.get("op_archs")
    if not isinstance(op_archs, dict) or not build.get("archs"):
        return None if not isinstance(op_archs, dict) else []
    return sorted(op for op in build.get("ops") or [] if op in op_archs and not op_archs[op])
