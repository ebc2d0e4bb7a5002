from __future__ import annotations

from pathlib import Path

import pytest

from builder import cmd
from builder.errors import ToolError

pytestmark = pytest.mark.spawns


def test_run_returns_output_and_keeps_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "logs" / "x.log"
    out = cmd.run(["sh", "-c", "echo hello; echo oops >&2"], log=log)
    assert out == "hello\noops\n"
    assert "+ sh -c 'echo hello; echo oops >&2'" in capsys.readouterr().err
    text = log.read_text()
    assert "hello\noops\n" in text and "# exit status 0" in text


def test_failure_shows_the_tail_and_the_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    with pytest.raises(ToolError) as err:
        cmd.run(["sh", "-c", "echo compiling; echo 'fatal: no cusparse.h'; exit 3"], log=log)
    assert "exit status 3" in err.value.message
    assert "fatal: no cusparse.h" in err.value.message
    assert str(log) in err.value.message


def test_missing_program_is_named_before_running() -> None:
    with pytest.raises(ToolError, match="'no-such-program-xyz' was not found on PATH"):
        cmd.run(["no-such-program-xyz", "--version"])


def test_progress_sees_every_line(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []

    def pick(line: str) -> str | None:
        seen.append(line)
        return line.upper() if line.startswith("[") else None

    cmd.run(["sh", "-c", "echo a; echo '[1/2] b'; echo c"], progress=pick)
    assert seen == ["a", "[1/2] b", "c"]
    assert "[1/2] B" in capsys.readouterr().err


def test_relative_program_survives_cwd_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "bin" / "tool"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\npwd\n")
    script.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    assert cmd.run(["bin/tool"], cwd=elsewhere).strip() == str(elsewhere)
