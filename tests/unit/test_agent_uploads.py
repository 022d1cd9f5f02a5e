"""The agent's uploads of checkpoints and outputs against a real HTTP server speaking the
artifact protocol: in parts, through the API or straight to the store, a few at a time, and
never given up while the store is away."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.artifacts import uploader as uploads
from node_agent.artifacts.uploader import Artifact, ArtifactUploader
from node_agent.client import ApiUnavailable, ControlPlaneClient
from tests.artifact_plane import ArtifactPlane, serve_plane
from tests.support import wait_until


@pytest.fixture
def plane() -> Iterator[ArtifactPlane]:
    plane = ArtifactPlane()
    server = serve_plane(plane)
    yield plane
    server.shutdown()


@pytest.fixture
def client(plane: ArtifactPlane) -> Iterator[ControlPlaneClient]:
    client = ControlPlaneClient(plane.url, plane.token, retry_for=1.0)
    yield client
    client.close()


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call retries for a blip only, then the upload's own wait (shortened) takes over."""
    monkeypatch.setattr(uploads, "BLIP_S", 0.05)
    monkeypatch.setattr(uploads, "FIRST_BACKOFF_S", 0.01)
    monkeypatch.setattr(uploads, "MAX_BACKOFF_S", 0.05)


def output_dir(tmp_path: Path, size: int = 300_000) -> tuple[Path, bytes]:
    output = tmp_path / "job" / "output"
    output.mkdir(parents=True)
    weights = os.urandom(size)
    (output / "weights.bin").write_bytes(weights)
    (output / "notes.txt").write_text("trained for one epoch\n")
    return output, weights


def the_output(output: Path) -> Artifact:
    return Artifact("job-1", "output", None, "node-1", 0, output, trusted=output.parent)


def test_an_output_goes_up_in_parts_through_the_api_and_is_recorded_with_its_sha256(
    plane: ArtifactPlane, client: ControlPlaneClient, tmp_path: Path
) -> None:
    output, weights = output_dir(tmp_path)

    answer = ArtifactUploader(client).upload(the_output(output))

    [(begun, files, completed)] = plane.completed
    assert files == {"weights.bin": weights, "notes.txt": b"trained for one epoch\n"}
    assert len(completed["parts"]) == -(-completed["size"] // plane.part_size) > 1
    assert begun["size_hint"] == len(weights) + len("trained for one epoch\n")
    assert answer == {"node_index": 0, "size": completed["size"], "sha256": completed["sha256"]}
    assert all(auth == f"Bearer {plane.token}" for _, _, auth in plane.requests)


def test_parts_go_straight_to_the_store_without_the_token_four_at_a_time_at_most(
    plane: ArtifactPlane, client: ControlPlaneClient, tmp_path: Path
) -> None:
    plane.straight_to_store = True
    plane.part_size = 16 * 1024
    output, weights = output_dir(tmp_path, size=400_000)

    ArtifactUploader(client, concurrency=4).upload(the_output(output))

    [(_, files, completed)] = plane.completed
    assert files["weights.bin"] == weights
    to_store = [auth for method, path, auth in plane.requests if path.startswith("/store/")]
    assert len(to_store) == len(completed["parts"]) > 20
    assert set(to_store) == {None}  # a presigned URL is the credential: no token goes there
    assert 2 <= plane.most_in_flight <= 4


def test_the_upload_waits_while_the_store_is_away_says_so_and_completes_once_it_is_back(
    plane: ArtifactPlane, client: ControlPlaneClient, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    plane.straight_to_store = True
    plane.store_down_for = 40  # many times what one call retries by itself
    output, weights = output_dir(tmp_path)

    with caplog.at_level(logging.WARNING, logger="flexai.agent"):
        ArtifactUploader(client).upload(the_output(output))

    assert plane.store_down_for <= 0
    assert plane.completed[0][1]["weights.bin"] == weights
    said = [r.getMessage() for r in caplog.records if "waits for the artifact store" in r.message]
    assert said and "output_0.zip" in said[0] and "storage-unavailable" in said[0]


def test_a_part_url_that_expired_is_asked_for_again(
    plane: ArtifactPlane, client: ControlPlaneClient, tmp_path: Path
) -> None:
    plane.straight_to_store = True
    plane.expire_parts = 2
    output, weights = output_dir(tmp_path)

    ArtifactUploader(client).upload(the_output(output))

    assert plane.completed[0][1]["weights.bin"] == weights
    asked = [path for method, path, _ in plane.requests if path.endswith("/parts")]
    assert len(asked) >= 2  # the batch, then again for each part refused


def test_an_artifact_the_ledger_holds_already_is_not_sent_again(
    plane: ArtifactPlane, client: ControlPlaneClient, tmp_path: Path
) -> None:
    (tmp_path / "ckpt" / "checkpoint-1").mkdir(parents=True)
    (tmp_path / "ckpt" / "checkpoint-1" / "model.safetensors").write_bytes(b"w" * 10)
    checkpoint = Artifact("job-1", "checkpoint", "checkpoint-1", "node-1", 0,
                          tmp_path / "ckpt" / "checkpoint-1", trusted=tmp_path)  # fmt: skip
    uploader = ArtifactUploader(client)
    first = uploader.upload(checkpoint)
    sent = len(plane.requests)

    again = uploader.upload(checkpoint)  # an agent restarted after the first went through

    assert again == first
    assert len(plane.requests) == sent + 1  # the begin alone, answered "recorded"
    assert len(plane.completed) == 1


def test_the_agents_shutdown_ends_the_wait_without_completing(
    plane: ArtifactPlane, client: ControlPlaneClient, tmp_path: Path
) -> None:
    plane.straight_to_store = True
    plane.store_down_for = 10**9
    output, _ = output_dir(tmp_path)
    failures: list[BaseException] = []

    def upload() -> None:
        try:
            ArtifactUploader(client).upload(the_output(output))
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=upload)
    thread.start()
    wait_until(lambda: any(path.startswith("/store/") for _, path, _ in plane.requests))
    stopped_at = time.monotonic()
    client.stop_retrying()
    thread.join(5)

    assert not thread.is_alive() and time.monotonic() - stopped_at < 2
    assert [type(error) for error in failures] == [ApiUnavailable]
    assert plane.completed == []


def test_the_sha256_sent_is_the_one_of_the_bytes_that_arrived(
    plane: ArtifactPlane, client: ControlPlaneClient, tmp_path: Path
) -> None:
    plane.part_size = 8 * 1024
    output, _ = output_dir(tmp_path, size=100_000)

    ArtifactUploader(client).upload(the_output(output))

    session = next(iter(plane.sessions.values()))
    data = b"".join(session.parts[number] for number in sorted(session.parts))
    assert hashlib.sha256(data).hexdigest() == plane.completed[0][2]["sha256"]
    assert all(len(session.parts[n]) == plane.part_size for n in sorted(session.parts)[:-1])
