"""The `flexai` commands of runtimes against the real server application (each store): an
admin makes one with `admin runtime create`, everyone lists it with `runtime list`, FlexAI's
own form `training run NAME -u URL --runtime nvidia-25.06 -- train.py` is accepted once it
exists (refused, naming what to do, before), `inspect` shows the image pinned, and `admin
runtime delete` takes it away. Only the transport is swapped (see test_sharing_cli)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main
from tests.integration import test_sharing_cli

use = test_sharing_cli.use
Use = test_sharing_cli.Use
IMAGE = "docker://nvcr.io/nvidia/pytorch:25.06-py3"


def run_in(runtime: str, repo: Path, name: str = "trainer") -> int:
    (repo / ".git").mkdir(exist_ok=True)  # the CLI checks that -u is a git checkout's root
    return main(["training", "run", name, "-u", str(repo), "--runtime", runtime, "--",
                 "train.py"])  # fmt: skip


def test_flexais_runtime_flag_is_accepted_once_an_admin_made_the_runtime(
    use: Use, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    use("alice")
    assert run_in("nvidia-25.06", tmp_path) == 1
    refused = capsys.readouterr().err
    assert "no runtime named 'nvidia-25.06'" in refused
    assert "flexai admin runtime create NAME --image REF" in refused
    use("admin")
    assert main(["admin", "runtime", "create", "nvidia-25.06", "--image",
                 "nvcr.io/nvidia/pytorch:25.06-py3"]) == 0  # fmt: skip
    assert f"Created runtime nvidia-25.06: {IMAGE}." in capsys.readouterr().out
    use("alice")
    assert main(["runtime", "list"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["NAME", "IMAGE", "DIGEST", "NODES"]
    assert row.split() == ["nvidia-25.06", IMAGE, "-", "-"]
    assert run_in("nvidia-25.06", tmp_path) == 0
    assert "Training job trainer started" in capsys.readouterr().out
    assert main(["training", "inspect", "trainer"]) == 0
    shown = capsys.readouterr().out
    assert "    name: nvidia-25.06" in shown and f"    image: {IMAGE}" in shown
    assert "    digest: (none reported)" in shown


def test_an_unknown_runtime_names_those_there_are_and_host_needs_none(
    use: Use, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    use("admin")
    assert main(["admin", "runtime", "create", "rocm-6", "--image",
                 "docker://docker.io/rocm/pytorch:latest"]) == 0  # fmt: skip
    use("alice")
    capsys.readouterr()
    assert run_in("cuda-12", tmp_path) == 1
    assert "use one of rocm-6" in capsys.readouterr().err
    assert run_in("host", tmp_path, "on-host") == 0
    capsys.readouterr()
    assert main(["training", "inspect", "on-host"]) == 0
    assert "  runtime:" not in capsys.readouterr().out


def test_only_an_admin_makes_or_deletes_a_runtime_and_a_bad_image_is_a_usage_error(
    use: Use, capsys: pytest.CaptureFixture[str]
) -> None:
    use("alice")
    assert main(["admin", "runtime", "create", "mine", "--image", IMAGE]) == 1
    assert "admin" in capsys.readouterr().err
    use("admin")
    assert main(["admin", "runtime", "create", "mine", "--image", "ubuntu:24.04"]) == 2
    assert "the registry's host is needed" in capsys.readouterr().err
    assert main(["admin", "runtime", "create", "mine", "--image", IMAGE]) == 0
    use("alice")
    assert main(["admin", "runtime", "delete", "mine"]) == 1
    use("admin")
    capsys.readouterr()
    assert main(["admin", "runtime", "delete", "mine"]) == 0
    assert "Deleted runtime mine." in capsys.readouterr().out
    assert main(["runtime", "list"]) == 0
    assert "No runtimes" in capsys.readouterr().out
