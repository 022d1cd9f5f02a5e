"""Runtimes end to end (real server and agent processes, each store), against a registry on
loopback (``tests/registry.py``: plain HTTP, one htpasswd user) that the agent may reach over
HTTP (``flexai agent --insecure-registry``). An admin keeps the registry's login in a secret
and makes a runtime of a private image with it: a job on it is built with the image pulled,
and shows the runtime, the image and the digest pulled, while the password is nowhere to be
read; a second job on it pulls nothing, the image being in the node's cache; a wrong password
and a tag that is not there fail the job ``image_pull_failed``, the infrastructure's failure,
saying what the registry answered; and ``--runtime`` naming no runtime is refused before
anything is recorded."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import FLEXAI, Cluster, start_cluster
from tests.pg import fresh_database
from tests.registry import MARKER, Registry, make_image, missing_tools, push, running_registry

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        bool(missing_tools()),
        reason=f"apt-get install {' '.join(missing_tools())} (scripts/test does) to pull images",
    ),
]
RepoFactory = Callable[[dict[str, str]], Path]

IMAGE = "flexai/pytorch:25.06"
"""The image's path and tag in the test registry."""
RUNTIME = "nvidia-25.06"
TRAIN = 'print("trained in a runtime", flush=True)\n'
WRONG_PASSWORD = "not-the-registry-password"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """One registry for the module, holding the private image ``IMAGE``."""
    folder = tmp_path_factory.mktemp("runtimes-registry")
    with running_registry(folder / "registry") as running:
        files = {"/etc/os-release": f"ID=test\n{MARKER}\n", "/usr/bin/hello": "#!/bin/sh\n"}
        push(make_image(folder / "layout", files), running, IMAGE)
        yield running


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          registry: Registry) -> Iterator[Cluster]:  # fmt: skip
    """A cluster whose agent reaches the registry over plain HTTP, with the admin's runtime
    ``RUNTIME`` of the private image and its login in the admin's secret."""
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        cluster = start_cluster(tmp_path_factory.mktemp(f"runtimes-{request.param}"),
                                database_url,
                                agent_flags=("--insecure-registry", registry.address))  # fmt: skip
        stack.callback(cluster.stop)
        create_secret(cluster, "registry-login", registry.credentials)
        image = registry.reference(IMAGE)
        cluster.flexai("admin", "runtime", "create", RUNTIME, "--image", image,
                       "--registry-secret", "registry-login")  # fmt: skip
        yield cluster


def create_secret(cluster: Cluster, name: str, value: str) -> None:
    done = subprocess.run([*FLEXAI, "secret", "create", name], input=value + "\n", text=True,
                          env=cluster.env, capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run_job(cluster: Cluster, repo: Path, runtime: str, status: str) -> tuple[str, dict[str, Any]]:
    """A job of ``train.py`` in ``runtime``, once it is ``status``: its name and document."""
    name = new_name("rt")
    cluster.flexai("training", "run", name, "-u", str(repo), "--runtime", runtime, "--", "train.py")
    return name, cluster.wait_for(name, {status})


def job_repo(repo_factory: RepoFactory) -> Path:
    return repo_factory({"train.py": TRAIN, "requirements.txt": "# nothing\n"})


def build_lines(cluster: Cluster, name: str) -> list[str]:
    return cluster.flexai("training", "logs", name).stdout.splitlines()


def test_a_job_runs_on_an_admins_runtime_of_a_private_image_and_the_password_is_nowhere(
    fleet: Cluster, registry: Registry, repo_factory: RepoFactory
) -> None:
    listed = fleet.flexai("runtime", "list").stdout
    assert RUNTIME in listed and registry.reference(IMAGE) in listed
    name, job = run_job(fleet, job_repo(repo_factory), RUNTIME, "succeeded")
    digest = job["image_digest"]
    assert digest.startswith("sha256:") and len(digest) == 71
    assert job["spec"]["runtime"] == RUNTIME
    assert job["spec"]["runtime_image"] == registry.reference(IMAGE)
    assert job["spec"]["registry_secret"] == "registry-login"

    logs = fleet.flexai("training", "logs", name).stdout
    assert "trained in a runtime" in logs
    assert f"asking {registry.address} for its digest" in logs
    assert f"pulling {digest}" in logs and "Copying blob" in logs
    assert f"pulled ({digest})" in logs

    inspected = fleet.flexai("training", "inspect", name).stdout
    assert RUNTIME in inspected and registry.reference(IMAGE) in inspected
    assert digest in inspected and "registry-login" in inspected
    as_json = fleet.flexai("training", "inspect", name, "--json").stdout
    document = json.loads(as_json)
    assert document["image_digest"] == digest
    assert document["spec"]["runtime"] == RUNTIME
    assert document["spec"]["runtime_image"] == registry.reference(IMAGE)
    assert (fleet.root / "agent" / "images" / digest[7:] / "rootfs" / "etc"
            / "os-release").read_text().count(MARKER) == 1  # fmt: skip

    history = fleet.flexai("training", "history", name).stdout
    seen = [logs, inspected, as_json, listed, history, fleet.log("server"), fleet.log("agent")]
    assert [text for text in seen if registry.password in text] == []


def test_a_second_job_on_the_runtime_takes_the_image_from_the_nodes_cache(
    fleet: Cluster, repo_factory: RepoFactory
) -> None:
    repo = job_repo(repo_factory)
    _, first = run_job(fleet, repo, RUNTIME, "succeeded")  # pulled here, or by a test before
    name, again = run_job(fleet, repo, RUNTIME, "succeeded")
    assert again["image_digest"] == first["image_digest"]
    lines = build_lines(fleet, name)
    assert f"in this node's cache ({again['image_digest']})" in "\n".join(lines)
    assert not [line for line in lines if "Copying blob" in line or "pulling sha256:" in line]


def failed_pull(fleet: Cluster, registry: Registry, repo: Path, path: str, secret: str,
                reason: str) -> tuple[str, str]:  # fmt: skip
    """A job on a new runtime of ``path`` in the registry, logged in with ``secret``, failed
    ``image_pull_failed`` for ``reason``, the infrastructure's failure, in the build, with no
    traceback in the agent's log: its name and its ``inspect`` view."""
    runtime = new_name("pull")
    fleet.flexai("admin", "runtime", "create", runtime, "--image", registry.reference(path),
                 "--registry-secret", secret)  # fmt: skip
    name, job = run_job(fleet, repo, runtime, "failed")
    failure = job["failure"]
    assert failure["code"] == "image_pull_failed", failure
    assert f"cannot pull image {registry.address}/{path}: {reason}" in failure["message"]
    assert failure.get("kind") == "infrastructure" and job.get("image_digest") is None
    inspected = fleet.flexai("training", "inspect", name).stdout
    assert "image_pull_failed" in inspected and reason in inspected
    assert "the infrastructure's, not the job's; it was run without retries" in inspected
    assert "Traceback" not in fleet.log("agent")
    assert "trained in a runtime" not in fleet.flexai("training", "logs", name).stdout
    return name, inspected


def test_a_wrong_registry_password_fails_the_job_image_pull_failed_unauthorized(
    fleet: Cluster, registry: Registry, repo_factory: RepoFactory
) -> None:
    secret = new_name("wrong")
    create_secret(fleet, secret, f"{registry.user}:{WRONG_PASSWORD}")
    name, inspected = failed_pull(fleet, registry, job_repo(repo_factory), IMAGE, secret,
                                  "unauthorized")  # fmt: skip
    logs = fleet.flexai("training", "logs", name).stdout
    assert "check the registry secret's USER:PASSWORD" in logs
    assert [text for text in (logs, inspected, fleet.log("agent"), fleet.log("server"))
            if WRONG_PASSWORD in text or registry.password in text] == []  # fmt: skip


def test_a_tag_that_is_not_there_fails_the_job_image_pull_failed_not_found(
    fleet: Cluster, registry: Registry, repo_factory: RepoFactory
) -> None:
    _, inspected = failed_pull(fleet, registry, job_repo(repo_factory), "flexai/pytorch:99.99",
                               "registry-login", "not found")  # fmt: skip
    assert "check the image's name and tag" in inspected


def test_a_runtime_that_is_not_there_is_refused_before_anything_is_recorded(
    fleet: Cluster, repo_factory: RepoFactory
) -> None:
    name = new_name("none")
    refused = fleet.flexai("training", "run", name, "-u", str(job_repo(repo_factory)),
                           "--runtime", "nvidia-99.01", "--", "train.py", check=False)  # fmt: skip
    said = refused.stdout + refused.stderr
    assert refused.returncode == 1, said
    assert "there is no runtime named 'nvidia-99.01'" in said
    assert "use one of " in said and RUNTIME in said  # the runtimes there are
    assert "or host for the node's own system" in said
    assert fleet.api("GET", f"/v1/jobs/{name}").status_code == 404
    ever = fleet.api("GET", "/v1/audit/jobs", params={"name": name})  # the ledger: no event
    assert ever.status_code == 200 and ever.json()["jobs"] == [], ever.text
    assert name not in fleet.flexai("training", "list").stdout
