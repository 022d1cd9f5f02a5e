"""The `flexai` entry point: help without heavy imports, dispatch, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("fastapi", "uvicorn", "eventsourcing", "starlette", "pydantic", "httpx", "psycopg")


def modules_loaded_by(argv: list[str]) -> tuple[int, str, set[str]]:
    script = (
        "import json, sys\n"
        "from cli.main import main\n"
        f"code = main({argv!r})\n"
        "sys.stdout.flush()\n"
        "loaded = sorted(name for name, module in sys.modules.items() if module is not None)\n"
        "sys.stderr.write('\\n' + json.dumps([code, loaded]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    code, modules = json.loads(done.stderr.strip().splitlines()[-1])
    return code, done.stdout, {name.split(".")[0] for name in modules}


@pytest.mark.parametrize(
    "argv", [["--help"], ["training", "--help"], ["training", "run", "--help"]]
)
def test_help_imports_no_server_agent_or_http_library(argv: list[str]) -> None:
    code, out, loaded = modules_loaded_by(argv)
    assert code == 0
    assert "usage: flexai" in out
    assert loaded.isdisjoint(HEAVY), loaded & set(HEAVY)
    assert loaded.isdisjoint({"api", "domain", "projections", "node_agent"})


def test_a_command_that_calls_the_api_imports_no_command_line_of_httpx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEXAI_API_URL", "http://127.0.0.1:9")  # nothing listens: it fails
    monkeypatch.setenv("FLEXAI_TOKEN", "not-a-token")
    code, _, loaded = modules_loaded_by(["training", "list"])
    assert code != 0 and "httpx" in loaded
    assert loaded.isdisjoint({"rich", "pygments", "click"}), loaded & {"rich", "pygments", "click"}


def test_training_help_lists_every_subcommand_with_its_summary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["training", "--help"]) == 0
    out = capsys.readouterr().out
    for summary in (
        "run        Starts a new Training Job.",
        "list       Lists all the Training Jobs.",
        "inspect    Displays detailed information about a Training Job.",
        "logs       Displays the logs from a Training Job.",
        "fetch      Fetches artifacts from a Training Job.",
        "stop       Stops a Training Job.",
        "delete     Deletes a Training Job.",
    ):
        assert summary in out
    assert "checkpoints" in out and "Lists out the checkpoints" in out


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("flexai ")


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: flexai" in capsys.readouterr().out
    assert main(["training"]) == 2
    assert "usage: flexai training" in capsys.readouterr().out


def test_an_unknown_subcommand_is_one_usage_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["training", "launch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument SUBCOMMAND: invalid choice: 'launch'")
    assert err.count("\n") == 1


def test_arguments_after_double_dash_are_refused_outside_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["training", "logs", "my-job", "--", "x"]) == 2
    assert "takes no arguments after `--`" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "module"), [("server", "api.server"), ("agent", "node_agent.main")]
)
def test_server_and_agent_get_the_rest_of_the_command_line(
    command: str, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 3

    fake = types.ModuleType(module)
    fake.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module, fake)
    assert main([command, "--port", "8000", "--", "x"]) == 3
    assert seen == [["--port", "8000", "--", "x"]]


def test_a_missing_config_is_one_error_line_without_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLEXAI_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.delenv("FLEXAI_API_URL", raising=False)
    monkeypatch.delenv("FLEXAI_TOKEN", raising=False)
    assert main(["training", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no API URL: set FLEXAI_API_URL")
    assert err.count("\n") == 1
