from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.errors import BuilderError, ToolError
from builder.node import Trust, key_from_line
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


KEY = key_from_line("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAILF4WHI7T5v/sYCfwHBDEp/UDmc1973dx9ZYD7xGdfok", "test")
OLD = key_from_line("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIGVUh3Xdxrv3hDqTRV4cd0gAAVCtHKsdxSeQRIq6CgxT", "test")


def test_host_script_and_pdsh_command(tmp_path: Path) -> None:
    script = host_script(Host("worker-1", 8, "/opt/py"), "http://10.0.0.1:8765", Trust((KEY,)))
    assert script.startswith("#!/bin/sh\n") and "worker-1" in script
    assert "PY=/opt/py" in script and "WH=http://10.0.0.1:8765" in script
    # The key is inline; the signature is checked before the installer is fetched, and the installer
    # runs with the same key (nothing from the wheelhouse decides what is trusted).
    assert f'ds-wheelhouse namespaces="ds-wheelhouse" {KEY.line()}' in script
    verify_at = script.index("ssh-keygen -Y verify")
    assert script.index('fetch.py" manifest') < verify_at < script.index('fetch.py" installer')
    assert script.rstrip().endswith('"$PY" "$tmp/install.py" --wheelhouse "$WH" --trust "$tmp/allowed_signers"')
    assert " -r " not in script
    revoked = host_script(Host("w"), "/wh", Trust((KEY,), (OLD,)))
    assert f"{OLD.line()}\nDS_REVOKED" in revoked and '-r "$tmp/revoked"' in revoked
    assert revoked.rstrip().endswith('--trust "$tmp/allowed_signers" --trust "$tmp/revoked.trust"')
    hosts = [Host("a"), Host("b")]
    ssh = pdsh_command(hosts, tmp_path, "ssh")
    assert ssh[:7] == ["pdsh", "-S", "-R", "exec", "-f", "2", "-w"] and ssh[7] == "a,b"
    assert ssh[-1] == f"ssh -o BatchMode=yes %h sh -s < {tmp_path.resolve()}/%h.sh"
    assert pdsh_command(hosts, tmp_path, "local")[-1] == f"sh {tmp_path.resolve()}/%h.sh"
    config = tmp_path / "my cluster" / "ssh_config"
    with_config = pdsh_command(hosts, tmp_path, "ssh", config)[-1]
    assert with_config.startswith(f"ssh -F '{config.resolve()}' -o BatchMode=yes %h sh -s < ")


def test_each_hosts_outcome_is_read_from_pdshs_output() -> None:
    """pdsh prefixes every line with its host: the wheel installed, or the installer's error, the
    lines under it (each wheel and why it does not fit) and its fix; a host that said nothing else
    gets its last words and the log."""
    from builder.wheelhouse.provision import host_outcomes

    wheel = "deepspeed-0.19.8+cpu-cp311-cp311-manylinux_2_35_x86_64.whl"
    said = "\n".join([
        "node1: ==> manifest signed by SHA256:abc: serial 3",
        f"node1: ==> installed {wheel}",
        "node2: ==> node: python cp39, glibc 2.31",
        "node2: error: no wheel in the wheelhouse fits this node (python cp39, glibc 2.31); it has:",
        f"node2:   {wheel}: built for cp311, node has cp39; needs glibc 2.35 or newer, node has 2.31",
        'node2:   fix: build one for this node: a recipe with python = ["3.9"]',
        "node3: ssh: connect to host node3 port 22: No route to host",
        "pdsh@build: node3: ssh exited with exit code 255",
        f"node9: ==> installed {wheel}",  # a host not asked about: ignored
        "node5: ==> installed ../../etc/passwd",  # what another machine says is checked
        "node6: error: \x1b]0;owned\x07no wheel fits",  # a terminal escape is not passed on
    ])  # fmt: skip
    hosts = [Host("node1"), Host("node2"), Host("node3"), Host("node4"), Host("node5"), Host("node6")]
    got = {o.node: o for o in host_outcomes(hosts, said)}
    assert got["node1"].installed and got["node1"].detail == wheel
    assert not got["node2"].installed and got["node2"].detail == (
        f"no wheel in the wheelhouse fits this node (python cp39, glibc 2.31); it has: {wheel}: built for cp311, "
        "node has cp39; needs glibc 2.35 or newer, node has 2.31 "
        '(fix: build one for this node: a recipe with python = ["3.9"])'
    )
    assert got["node3"].detail == "ssh: connect to host node3 port 22: No route to host (read the provision log)"
    assert got["node4"].detail == "no output (read the provision log)"
    assert not got["node5"].installed and "is not a wheel file name" in got["node5"].detail
    assert got["node6"].detail == "]0;ownedno wheel fits"


def test_srun_runs_one_install_per_node_with_a_result_file_each(tmp_path: Path) -> None:
    from builder.wheelhouse.provision import srun_command

    args = srun_command(["n1", "n2"], "gpu", tmp_path / "node.sh", tmp_path)
    assert args[:4] == ["srun", "--job-name=ds-provision", "--nodes=2", "--ntasks-per-node=1"]
    assert "--nodelist=n1,n2" in args and f"--output={tmp_path}/results/%N.json" in args
    assert args[-3:] == ["--partition=gpu", "sh", str(tmp_path / "node.sh")]
    script = host_script(Host("every node"), "/shared/wheelhouse", Trust((KEY,)), json_result=True)
    assert "WH=/shared/wheelhouse" in script
    assert script.endswith('"$PY" "$tmp/install.py" --wheelhouse "$WH" --trust "$tmp/allowed_signers" --json\n')


def test_each_nodes_result_is_checked_before_it_is_believed(tmp_path: Path) -> None:
    """A node's result is a file a remote job wrote: anything but the installer's own JSON is a failure."""
    from builder.wheelhouse.provision import node_outcome

    results = tmp_path / "results"
    results.mkdir()
    wheel = "deepspeed-0.19.8+cpu-cp311-cp311-manylinux_2_35_x86_64.whl"
    cases = {
        "ok": ({"installed": True, "wheel": wheel}, True, wheel),
        "error": ({"error": "no wheel fits this node", "fix": "build one", "exit_code": 3}, False, "no wheel fits"),
        "dry": ({"installed": False, "wheel": wheel}, False, "did not report an install"),
        "evil": ({"installed": True, "wheel": "../../etc/passwd"}, False, "is not a wheel file name"),
        "list": ([1, 2], False, "not a JSON object"),
    }
    for node, (data, _, _) in cases.items():
        (results / f"{node}.json").write_text(json.dumps(data))
    (results / "garbled.json").write_text("pip says hello {")
    for node, (_, installed, detail) in cases.items():
        got = node_outcome(node, tmp_path)
        assert got.installed is installed and detail in got.detail, (node, got)
    assert "not the installer's JSON" in node_outcome("garbled", tmp_path).detail
    assert node_outcome("silent", tmp_path).detail == f"no result: read {tmp_path}/logs/silent.log"


def test_fanout_shares_and_checks_every_result_against_the_manifest() -> None:
    """Many installs at once (bench --cluster): a share per node, and each install's JSON held to
    the signed manifest's sha256 of the wheel it chose; anything else is a problem, named."""
    from builder.wheelhouse.fanout import check, node_script, shares

    assert shares(64, 3) == [22, 21, 21] and shares(2, 3) == [1, 1, 0]
    wheels, deps = {"w.whl": "a" * 64}, {"d.whl": "b" * 64}
    good = {"rc": 0, "out": {"wheel": "w.whl", "sha256": "a" * 64, "dependencies": ["d.whl"]}}
    rows = [
        good,
        {"rc": 9, "err": "error: no wheel fits"},
        {"rc": 0, "out": {"wheel": "w.whl", "sha256": "c" * 64, "dependencies": []}},
        {"rc": 0, "out": "not JSON: Expecting value: line 1 column 1 (char 0)"},
        {"rc": 0, "out": {"wheel": "w.whl", "sha256": "a" * 64, "dependencies": ["evil.whl"]}},
    ]
    problems = check(rows, wheels, deps)
    assert [p.split(" ", 2)[1].rstrip(":") for p in problems] == ["1", "2", "3", "4"]
    assert "exited 9: error: no wheel fits" in problems[0] and "the manifest says " + "a" * 64 in problems[1]
    assert "not the installer's JSON" in problems[2] and "does not list" in problems[3]
    script = node_script("/opt/ds/bin/python", "http://node1/wheelhouse", 21, "ssh-ed25519 AAAA")
    assert "N=21" in script and '--dry-run --json --trust "$KEY"' in script and "KEY='ssh-ed25519 AAAA'" in script
    assert '"$URL/tools/ds-node-install.py"' in script


def test_what_nodes_and_the_cluster_file_say_is_checked_before_it_is_believed(tmp_path: Path) -> None:
    """bench --cluster reads rows a node printed and the cluster's own state file: a row that is not
    one is a problem, and a node name that would be an ssh option, an address that is not one or a
    relative python is refused with the fix."""
    from builder.bench.cluster import _cluster_state
    from builder.wheelhouse.fanout import parse_rows

    good = {"rc": 0, "start": 1.0, "end": 2.5, "err": "", "out": {"wheel": "w.whl"}}
    rows, problems = parse_rows("node1", [good, {**good, "rc": "0; rm"}, [1], {**good, "start": "soon"}])
    assert rows == [good] and len(problems) == 3
    assert "field 'rc'" in problems[0] and "not a JSON object" in problems[1] and "field 'start'" in problems[2]
    state = {
        "host_addr": "10.77.0.1",
        "web": "node1",
        "nodes": {"node1": {"python": "/opt/ds/bin/python", "torch": True}, "node4": {"python": "/usr/bin/python3"}},
    }
    (tmp_path / "cluster.json").write_text(json.dumps(state))
    assert _cluster_state(tmp_path) == ({"host_addr": "10.77.0.1", "web": "node1"}, [("node1", "/opt/ds/bin/python")])
    cases: list[tuple[dict[str, object], str]] = [
        ({"nodes": {"-oProxyCommand=sh": {"python": "/p", "torch": True}}}, "is not a node name"),
        ({"host_addr": "evil.example"}, "does not appear to be an IPv4 or IPv6 address"),
        ({"nodes": {"node1": {"python": "python3; rm -rf /", "torch": True}}}, "field 'python'"),
        ({"nodes": {}}, "lists no node with torch"),
    ]
    for change, why in cases:
        (tmp_path / "cluster.json").write_text(json.dumps({**state, **change}))
        with pytest.raises(ToolError, match=why):
            _cluster_state(tmp_path)
