"""A container registry for tests: Debian's ``docker-registry`` (the CNCF distribution registry)
on a loopback port, plain HTTP, one htpasswd user, and a small image made with ``umoci`` and
pushed with ``skopeo``.

:func:`missing_tools` says which of the tools are not installed (``scripts/test`` installs them
with apt-get); the tests that need them skip saying so.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

TOOLS = {"skopeo": "skopeo", "umoci": "umoci", "docker-registry": "docker-registry",
         "htpasswd": "apache2-utils"}  # fmt: skip
"""Each tool the tests run, and the Debian package that brings it."""
USER, PASSWORD = "flexai-user", "s3cret-registry-pass"
MARKER = "FLEXAI_TEST_IMAGE=marker-36"
"""A line of the test image's ``/etc/os-release``."""
START_TIMEOUT_S = 30.0


def missing_tools() -> list[str]:
    """The Debian packages to install before the registry tests can run."""
    return sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Registry:
    """A running registry: ``address`` is ``127.0.0.1:PORT``."""

    address: str
    user: str = USER
    password: str = PASSWORD

    def reference(self, path: str) -> str:
        return f"docker://{self.address}/{path}"

    @property
    def credentials(self) -> str:
        return f"{self.user}:{self.password}"


@contextmanager
def running_registry(folder: Path) -> Iterator[Registry]:
    """A registry keeping its blobs under ``folder``, until the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    htpasswd = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], check=True,
                              capture_output=True, text=True).stdout  # fmt: skip
    (folder / "htpasswd").write_text(htpasswd)
    port = free_port()
    config = folder / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        f"auth:\n  htpasswd:\n    realm: flexai-test\n    path: {folder / 'htpasswd'}\n"
    )
    with open(folder / "registry.log", "wb") as out:
        process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=out,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    try:
        _wait_for(port, process)
        yield Registry(f"127.0.0.1:{port}")
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"docker-registry exited with code {process.returncode}")
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"docker-registry did not listen on port {port}")


def make_image(layout: Path, files: dict[str, str]) -> str:
    """An OCI image at ``layout:test`` holding ``files`` (path -> text); returns its
    ``oci:`` reference for ``skopeo copy``."""
    image = f"{layout}:test"
    bundle = layout.parent / f"{layout.name}-bundle"
    _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", image)
    _run("umoci", "unpack", "--rootless", "--image", image, str(bundle))
    for path, text in files.items():
        target = bundle / "rootfs" / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    _run("umoci", "repack", "--image", image, str(bundle))
    shutil.rmtree(bundle)
    return f"oci:{image}"


def push(source: str, registry: Registry, path: str) -> None:
    """Copy an image (``oci:DIR:tag``) to ``registry`` as ``path`` (``test/img:1``)."""
    _run("skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false",
         "--dest-creds", registry.credentials, source, registry.reference(path))  # fmt: skip


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} failed: {done.stderr.strip()[-800:]}")
