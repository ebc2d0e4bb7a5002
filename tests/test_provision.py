from __future__ import annotations

from pathlib import Path

import pytest

from builder.errors import BuilderError
from builder.wheelhouse.provision import Host, host_script, parse_hostfile, pdsh_command


def test_hostfile_in_deepspeeds_format() -> None:
    text = "# cluster\nworker-0 slots=8\nworker-1 slots=8 python=/opt/torch/.venv/bin/python3\n\nlocalhost\n"
    assert parse_hostfile(text) == [
        Host("worker-0", 8),
        Host("worker-1", 8, "/opt/torch/.venv/bin/python3"),
        Host("localhost"),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "lists no hosts"),
        ("a slots=8\na slots=8\n", "lists a host twice"),
        ("a gpus=8\n", "unknown option gpus"),
        ("a b c\n", "cannot read 'a b c'"),
    ],
)
def test_bad_hostfiles(text: str, expected: str) -> None:
    with pytest.raises(BuilderError, match=expected):
        parse_hostfile(text, "hosts")


def test_host_script_and_pdsh_command(tmp_path: Path) -> None:
    script = host_script(Host("worker-1", 8, "/opt/py"), "http://10.0.0.1:8765", "ab" * 32)
    assert script.startswith("#!/bin/sh\n") and "worker-1" in script
    assert "PY=/opt/py" in script and "http://10.0.0.1:8765/tools/ds-node-install.py" in script
    assert f'"$tmp/install.py" {"ab" * 32}' in script  # the installer runs only with the published sha256
    assert '"$PY" "$tmp/install.py" --wheelhouse http://10.0.0.1:8765' in script
    hosts = [Host("a"), Host("b")]
    ssh = pdsh_command(hosts, tmp_path, "ssh")
    assert ssh[:7] == ["pdsh", "-S", "-R", "exec", "-f", "2", "-w"] and ssh[7] == "a,b"
    assert ssh[-1] == f"ssh -o BatchMode=yes %h sh -s < {tmp_path.resolve()}/%h.sh"
    assert pdsh_command(hosts, tmp_path, "local")[-1] == f"sh {tmp_path.resolve()}/%h.sh"
