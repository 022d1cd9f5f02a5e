"""Downloads of artifacts (`fetch`, the agent's input checkpoints and datasets) against a real
HTTP server: a redirect to the store followed without the token, a cut resumed with Range,
the file kept under its name only whole and with the recorded SHA-256."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.behind import Behind
from common.transfer import Altered, Unavailable, fetch
from tests.artifact_plane import ArtifactPlane, serve_plane

PATH = "/v1/jobs/my-job/outputs/0"
DATA = os.urandom(3 * 2**20 + 123)
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def plane() -> Iterator[ArtifactPlane]:
    plane = ArtifactPlane(objects={PATH: DATA}, recorded_sha={PATH: SHA})
    server = serve_plane(plane)
    yield plane
    server.shutdown()


@pytest.fixture
def api(plane: ArtifactPlane) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=plane.url, headers={"Authorization": f"Bearer {plane.token}"},
                      timeout=10) as client:  # fmt: skip
        yield client


def leftovers(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def test_a_download_redirected_to_the_store_goes_there_without_the_token(
    plane: ArtifactPlane, api: httpx.Client, tmp_path: Path
) -> None:
    plane.redirect = True

    fetched = fetch(api, PATH, tmp_path / "output_0.zip")

    assert (tmp_path / "output_0.zip").read_bytes() == DATA
    assert (fetched.size, fetched.sha256, fetched.verified) == (len(DATA), SHA, True)
    sent = {path.split("?")[0]: auth for _, path, auth in plane.requests}
    assert sent == {PATH: f"Bearer {plane.token}", f"/store/objects{PATH}": None}
    assert leftovers(tmp_path) == ["output_0.zip"]


@pytest.mark.parametrize("redirect", [False, True], ids=["from the server", "from the store"])
def test_a_cut_download_resumes_with_range_from_the_byte_reached(
    plane: ArtifactPlane, api: httpx.Client, tmp_path: Path, redirect: bool
) -> None:
    plane.redirect = redirect
    plane.cut_downloads = 2

    fetch(api, PATH, tmp_path / "output_0.zip")

    assert (tmp_path / "output_0.zip").read_bytes() == DATA
    assert len(plane.ranges) == 2
    assert all(int(asked.removeprefix("bytes=").rstrip("-")) > 0 for asked in plane.ranges)
    assert leftovers(tmp_path) == ["output_0.zip"]


def test_the_control_plane_request_carries_what_the_clients_hooks_add(
    plane: ArtifactPlane, tmp_path: Path
) -> None:
    def as_owner(request: httpx.Request) -> None:
        request.url = request.url.copy_merge_params({"owner": "ada"})

    with httpx.Client(base_url=plane.url, headers={"Authorization": f"Bearer {plane.token}"},
                      event_hooks={"request": [as_owner]}) as api:  # fmt: skip
        fetch(api, PATH, tmp_path / "output_0.zip")

    assert plane.requests == [("GET", f"{PATH}?owner=ada", f"Bearer {plane.token}")]
    assert (tmp_path / "output_0.zip").read_bytes() == DATA


def test_a_partial_file_of_an_earlier_fetch_is_resumed_not_fetched_again(
    plane: ArtifactPlane, api: httpx.Client, tmp_path: Path
) -> None:
    half = len(DATA) // 2
    (tmp_path / f".output_0.zip.{SHA[:16]}.part").write_bytes(DATA[:half])

    fetch(api, PATH, tmp_path / "output_0.zip")

    assert (tmp_path / "output_0.zip").read_bytes() == DATA
    assert plane.ranges == [f"bytes={half}-"]


def test_bytes_that_differ_from_the_recorded_sha256_are_refused_and_nothing_is_kept(
    plane: ArtifactPlane, api: httpx.Client, tmp_path: Path
) -> None:
    plane.recorded_sha[PATH] = "0" * 64
    (tmp_path / "output_0.zip").write_bytes(b"an older fetch")

    with pytest.raises(Altered) as refused:
        fetch(api, PATH, tmp_path / "output_0.zip", what="output_0.zip of job 'my-job'")

    said = str(refused.value)
    assert "output_0.zip of job 'my-job'" in said and "0" * 64 in said and SHA in said
    assert leftovers(tmp_path) == ["output_0.zip"]
    assert (tmp_path / "output_0.zip").read_bytes() == b"an older fetch"


def test_a_store_that_stays_away_is_told_quickly_with_its_reason(
    plane: ArtifactPlane, api: httpx.Client, tmp_path: Path
) -> None:
    plane.redirect = True
    plane.store_down_for = 10**9
    started = time.monotonic()

    with pytest.raises(Unavailable, match="503 storage-unavailable"):
        fetch(api, PATH, tmp_path / "output_0.zip", patience=1.0)

    assert time.monotonic() - started < 3
    assert not (tmp_path / "output_0.zip").exists()


def test_a_control_plane_that_cannot_be_reached_is_told_as_such(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2) as api,
          pytest.raises(Unavailable, match="cannot reach the control plane")):  # fmt: skip
        fetch(api, PATH, tmp_path / "output_0.zip", patience=0.5)
    assert leftovers(tmp_path) == []


def test_an_artifact_without_a_recorded_hash_is_checked_for_its_size_alone(
    plane: ArtifactPlane, api: httpx.Client, tmp_path: Path
) -> None:
    plane.recorded_sha[PATH] = None

    fetched = fetch(api, PATH, tmp_path / "output_0.zip")

    assert fetched.verified is False and fetched.sha256 == SHA
    assert (tmp_path / "output_0.zip").read_bytes() == DATA


class FullDisk:
    def write(self, data: bytes) -> int:
        raise OSError(28, "No space left on device")


def test_hashing_behind_the_stream_gives_the_whole_sha256_and_tells_a_write_that_failed() -> None:
    digest = hashlib.sha256()
    behind = Behind(digest, batch=1000)
    for start in range(0, len(DATA), 4096):
        behind.feed(DATA[start : start + 4096])
    behind.close()
    assert digest.hexdigest() == SHA

    failing = Behind(hashlib.sha256(), FullDisk(), batch=10)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="No space left"):
        for _ in range(100):
            failing.feed(b"x" * 100)
        failing.close()
