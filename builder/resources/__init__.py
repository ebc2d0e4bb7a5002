"""Code that runs in another interpreter: a build or smoke venv, or a node.

Each is a real file, linted and type-checked, run by path (`python FILE`), never kept as a
string: ds_probe.py (DeepSpeed's op list, in the build env), torch_probe.py (torch facts),
the smoke/ package (the smoke suite, a module per what it checks, run as one file that
builder.smoke.write_checks builds) and smoke_dist.py (its distributed worker, in the smoke venv).
"""

from pathlib import Path

RESOURCES = Path(__file__).resolve().parent


def resource(name: str) -> Path:
    """The path of a resource script, to run with another interpreter."""
    return RESOURCES / name


def report_after(text: str, marker: str) -> list[object]:
    """The JSON list a resource script printed after its marker line (what follows it, such as
    warnings printed at interpreter exit, is not part of it); ValueError naming what is wrong.
    Each item is the caller's to validate: it came from another process."""
    import json

    _, sep, payload = text.rpartition(marker)
    if not sep:
        raise ValueError("printed no report")
    try:
        value, _ = json.JSONDecoder().raw_decode(payload.lstrip())
    except json.JSONDecodeError as exc:
        raise ValueError(f"printed a report that is not valid JSON ({exc})") from exc
    if not isinstance(value, list):
        raise ValueError(f"printed a {type(value).__name__} as its report, not a list")
    return value
