"""The client as ``pip install flexai-control-plane`` leaves it, without the server's and the
agent's extras: a fresh interpreter where their packages refuse to import."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXTRAS_ONLY = (
    "fastapi", "starlette", "uvicorn", "httptools", "uvloop", "pydantic", "eventsourcing",
    "psycopg", "psycopg_pool", "prometheus_client", "jinja2", "boto3", "botocore", "orjson",
    "asyncssh", "pynvml",
)  # fmt: skip
"""What only ``[server]`` and ``[agent]`` bring, by import name."""

WITHOUT_EXTRAS = """
import contextlib, io, json, pkgutil, sys
from importlib.abc import MetaPathFinder

class Refuse(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

BLOCKED = set(sys.argv[1].split(","))
sys.meta_path.insert(0, Refuse())

import cli, common
from cli.main import build_parser, main

build_parser()  # every command's module
modules = [info.name for package in (cli, common)
           for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in modules:
    __import__(name)

said = {}
for argv in (["server", "--help"], ["agent"], ["training", "list"]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    said[" ".join(argv)] = [code, err.getvalue()]
said["loaded"] = sorted({name.split(".")[0] for name in sys.modules} & BLOCKED)
said["modules"] = len(modules)
print(json.dumps(said))
"""


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_client_runs_without_the_extras_and_the_server_and_agent_say_what_to_install(
    tmp_path: Path,
) -> None:
    env = {"PATH": "/usr/bin:/bin", "FLEXAI_CONFIG": str(tmp_path / "config.json"),
           "FLEXAI_API_URL": f"http://127.0.0.1:{closed_port()}",
           "FLEXAI_TOKEN": "t0ken"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, ",".join(EXTRAS_ONLY)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["loaded"] == []
    assert said["modules"] > 30
    for command in ("server", "agent"):
        code, err = said[command if command == "agent" else "server --help"]
        assert code == 1
        assert err.startswith(f"error: `flexai {command}` needs packages this installation lacks")
        assert f"pip install 'flexai-control-plane[{command}]'" in err
        assert "Traceback" not in err
    code, err = said["training list"]
    assert code == 1 and err.count("\n") == 1, err
    assert "Traceback" not in err and "ModuleNotFoundError" not in err
