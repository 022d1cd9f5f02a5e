"""Checkpoints: each child of output-checkpoint/ uploaded once, as a zip, when it is complete."""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

import pytest

from node_agent.artifacts.checkpoints import CheckpointWatcher, zip_tree
from tests.support import unzip


class RecordingClient:
    def __init__(self) -> None:
        self.uploads: list[tuple[str, dict[str, bytes]]] = []

    def upload_checkpoint(
        self, job_id: str, name: str, node_id: str, archive: Path, node_index: int = 0
    ) -> None:
        assert (job_id, node_id) == ("job-1", "node-1")
        self.uploads.append((name, unzip(archive)))

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.uploads]


@pytest.fixture
def client() -> RecordingClient:
    return RecordingClient()


def watcher(tmp_path: Path, client: RecordingClient, stable_for: float = 0.2) -> CheckpointWatcher:
    (tmp_path / "output-checkpoint").mkdir(exist_ok=True)
    (tmp_path / "scratch").mkdir(exist_ok=True)
    return CheckpointWatcher(
        client,  # type: ignore[arg-type]
        "job-1",
        "node-1",
        tmp_path / "output-checkpoint",
        tmp_path / "scratch",
        stable_for=stable_for,
        interval=0.05,
    )


def wait_for(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


def test_a_stable_checkpoint_directory_is_uploaded_once_with_its_contents(
    tmp_path: Path, client: RecordingClient
) -> None:
    watch = watcher(tmp_path, client)
    watch.start()
    step = tmp_path / "output-checkpoint" / "checkpoint-100"
    (step / "nested").mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"weights")
    (step / "nested" / "trainer_state.json").write_text("{}")
    wait_for(lambda: client.uploads)
    time.sleep(0.4)  # several more scans: no second upload
    watch.finish()
    assert client.uploads == [
        (
            "checkpoint-100",
            {"model.safetensors": b"weights", "nested/trainer_state.json": b"{}"},
        )
    ]
    assert not list((tmp_path / "scratch").iterdir())


def test_a_checkpoint_still_being_written_is_not_uploaded_yet(
    tmp_path: Path, client: RecordingClient
) -> None:
    watch = watcher(tmp_path, client, stable_for=1.0)
    watch.start()
    growing = tmp_path / "output-checkpoint" / "checkpoint-1"
    growing.mkdir()
    for i in range(10):
        (growing / f"shard-{i}").write_bytes(b"x")
        time.sleep(0.05)
        assert client.uploads == []
    watch.finish()
    assert client.names == ["checkpoint-1"]
    assert len(client.uploads[0][1]) == 10


def test_a_single_file_checkpoint_is_zipped_under_its_name(
    tmp_path: Path, client: RecordingClient
) -> None:
    watch = watcher(tmp_path, client)
    (tmp_path / "output-checkpoint" / "final.pt").write_bytes(b"tensor")
    watch.finish()
    assert client.uploads == [("final.pt", {"final.pt": b"tensor"})]


def test_the_final_scan_uploads_what_is_left_oldest_first_but_no_temporary_names(
    tmp_path: Path, client: RecordingClient
) -> None:
    watch = watcher(tmp_path, client)
    root = tmp_path / "output-checkpoint"
    for name in ("checkpoint-1", "checkpoint-2", "tmp-checkpoint-3", ".partial"):
        (root / name).mkdir()
        (root / name / "w").write_bytes(b"w")
        time.sleep(0.02)
    watch.finish()
    assert client.names == ["checkpoint-1", "checkpoint-2"]


def test_an_empty_output_directory_zips_to_an_empty_archive(tmp_path: Path) -> None:
    (tmp_path / "output").mkdir()
    zip_tree(tmp_path / "output", tmp_path / "output.zip", trusted=tmp_path)
    with zipfile.ZipFile(tmp_path / "output.zip") as bundle:
        assert bundle.namelist() == []
