"""Pulling a job's image from a real registry on loopback (``tests/registry.py``): with the
right credentials, with none or wrong ones, an unknown tag, a registry that is not there, and
again from the node's cache."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.accelerators import AcceleratorPool
from node_agent.images.cache import ImageCache
from node_agent.images.ensure import ImageSettings, ensure_image
from node_agent.images.pull import ImagePullFailed, RegistryCredentials
from node_agent.models import Assignment, JobSpec
from node_agent.supervisor import JobSupervisor, SupervisorSettings
from tests.registry import MARKER, Registry, free_port, make_image, missing_tools, push
from tests.registry import running_registry as start_registry
from tests.unit.test_agent_supervisor import FakeControlPlane, repo_and_commit

pytestmark = pytest.mark.skipif(
    bool(missing_tools()),
    reason=f"apt-get install {' '.join(missing_tools())} (scripts/test does) to pull images",
)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """One registry per test session, holding ``test/img:1``."""
    folder = tmp_path_factory.mktemp("registry")
    with start_registry(folder / "registry") as running:
        files = {"/etc/os-release": f"ID=test\n{MARKER}\n", "/usr/bin/hello": "#!/bin/sh\n"}
        image = make_image(folder / "layout", files)
        push(image, running, "test/img:1")
        yield running


@pytest.fixture
def cache(tmp_path: Path) -> ImageCache:
    return ImageCache(tmp_path / "images", 2**30)


def pull(registry: Registry, cache: ImageCache, path: str, credentials: str | None,
         lines: list[str] | None = None):  # type: ignore[no-untyped-def]  # fmt: skip
    return ensure_image(
        registry.reference(path),
        RegistryCredentials.from_secret(credentials) if credentials else None,
        cache=cache,
        insecure_registries={registry.address},
        log=(lines if lines is not None else []).append,
        cancel=threading.Event(),
    )


def test_an_image_is_pulled_with_the_registry_secret_and_its_files_unpacked(
    registry: Registry, cache: ImageCache
) -> None:
    lines: list[str] = []
    image = pull(registry, cache, "test/img:1", registry.credentials, lines)
    assert MARKER in (image.rootfs / "etc" / "os-release").read_text()
    assert image.digest.startswith("sha256:") and image.rootfs.parent.name == image.digest[7:]
    assert any("Copying blob" in line for line in lines)  # skopeo's progress, in the build log
    assert not any(registry.password in line for line in lines)


def test_a_second_pull_of_the_image_is_the_nodes_cached_copy(
    registry: Registry, cache: ImageCache
) -> None:
    first = pull(registry, cache, "test/img:1", registry.credentials)
    (first.rootfs.parent / "untouched").write_text("")
    lines: list[str] = []
    started = time.monotonic()
    again = pull(registry, cache, "test/img:1", registry.credentials, lines)
    assert (again.digest, again.rootfs) == (first.digest, first.rootfs)
    assert time.monotonic() - started < 5
    assert not any("Copying blob" in line for line in lines)
    assert "cache" in lines[-1]


@pytest.mark.parametrize("credentials", [None, "flexai-user:wrong-password"])
def test_a_pull_without_the_right_credentials_fails_unauthorized(
    registry: Registry, cache: ImageCache, credentials: str | None
) -> None:
    with pytest.raises(ImagePullFailed) as failed:
        pull(registry, cache, "test/img:1", credentials)
    assert failed.value.reason == "unauthorized"
    assert "test/img:1" in failed.value.message and "unauthorized" in failed.value.message
    assert cache.entries() == {}


def test_an_unknown_tag_fails_not_found(registry: Registry, cache: ImageCache) -> None:
    with pytest.raises(ImagePullFailed) as failed:
        pull(registry, cache, "test/img:404", registry.credentials)
    assert failed.value.reason == "not found"
    assert "manifest unknown" in failed.value.message


def test_a_registry_that_is_not_there_fails_unreachable(cache: ImageCache) -> None:
    gone = Registry(f"127.0.0.1:{free_port()}")
    with pytest.raises(ImagePullFailed) as failed:
        pull(gone, cache, "test/img:1", gone.credentials)
    assert failed.value.reason == "unreachable"
    assert "connection refused" in failed.value.message


def test_a_plain_http_registry_the_node_does_not_allow_is_refused(
    registry: Registry, cache: ImageCache
) -> None:
    with pytest.raises(ImagePullFailed) as failed:
        credentials = RegistryCredentials.from_secret(registry.credentials)
        ensure_image(registry.reference("test/img:1"), credentials, cache=cache)
    assert failed.value.reason == "TLS"
    assert "--insecure-registry" in failed.value.message


# -- in the build of a job ---------------------------------------------------------------------


class PlaneWithRegistry(FakeControlPlane):
    """A control plane that answers the registry login of the job's runtime."""

    def __init__(self, credentials: str) -> None:
        super().__init__()
        self.credentials = credentials
        self.asked: list[tuple[str, int]] = []

    def registry_credentials(self, job_id: str, node_index: int = 0) -> tuple[str, str]:
        self.asked.append((job_id, node_index))
        username, _, password = self.credentials.partition(":")
        return username, password


def build_in_image(tmp_path: Path, registry: Registry, image: str) -> PlaneWithRegistry:
    url, _ = repo_and_commit(tmp_path, "print('hi')\n")
    plane = PlaneWithRegistry(registry.credentials)
    spec = JobSpec(repository_url=url, entry_point=("train.py",),
                   runtime_image=registry.reference(image), registry_secret="registry-login",
                   registry_secret_owner="admin")  # fmt: skip
    supervisor = JobSupervisor(
        Assignment(job_id="job-1", name="img", status="building", spec=spec),
        client=plane,  # type: ignore[arg-type]
        node_id="node-1",
        pool=AcceleratorPool(),
        settings=SupervisorSettings(
            work_dir=tmp_path / "agent", log_flush_interval=0.05,
            images=ImageSettings(2**30, frozenset({registry.address})),
        ),  # fmt: skip
    )
    supervisor.start()
    supervisor.join(60)
    return plane


def test_a_job_naming_an_image_pulls_it_first_and_reports_its_digest_when_built(
    tmp_path: Path, registry: Registry
) -> None:
    plane = build_in_image(tmp_path, registry, "test/img:1")
    assert plane.reports("job-1") == ["built", "exited"]
    digest = plane.report_facts("job-1", "built")["image_digest"]
    log = plane.log_text("job-1")
    assert f"[build] image {registry.address}/test/img:1: pulled ({digest})" in log
    assert log.index("[build] Copying blob") < log.index("[build] cloning")
    assert registry.password not in log
    assert plane.asked == [("job-1", 0)]  # the runtime's login, asked of the control plane
    cached = tmp_path / "agent" / "images" / digest.removeprefix("sha256:") / "rootfs"
    assert MARKER in (cached / "etc" / "os-release").read_text()


def test_a_job_whose_image_cannot_be_pulled_fails_image_pull_failed_saying_why(
    tmp_path: Path, registry: Registry
) -> None:
    plane = build_in_image(tmp_path, registry, "test/img:missing")
    assert plane.reports("job-1") == ["build_failed"]
    facts = plane.report_facts("job-1", "build_failed")
    assert facts["code"] == "image_pull_failed"
    assert f"{registry.address}/test/img:missing: not found" in facts["message"]
    assert "Traceback" not in plane.log_text("job-1")
