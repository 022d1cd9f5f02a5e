"""Checkpoints: each child of output-checkpoint/ uploaded as a zip once it is complete; again,
as NAME.v2, when it changed after its upload (written in stages), the job's log told."""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from node_agent.artifacts.checkpoints import CheckpointWatcher
from node_agent.artifacts.uploader import Artifact
from node_agent.artifacts.zipping import write_zip
from node_agent.client import ApiUnavailable


class RecordingClient:
    """An uploader that keeps what it was given, zipped as the real one zips it."""

    def __init__(self) -> None:
        self.uploads: list[tuple[str, dict[str, bytes]]] = []
        self.away = False  # the agent shuts down: every upload gives up

    def upload(self, artifact: Artifact) -> dict[str, Any]:
        assert (artifact.job_id, artifact.node_id, artifact.kind) == ("job-1", "node-1",
                                                                      "checkpoint")
        if self.away:
            raise ApiUnavailable("the agent is shutting down")
        sink = io.BytesIO()
        write_zip(artifact.source, sink, trusted=artifact.trusted, top_files=artifact.top_files)
        with zipfile.ZipFile(sink) as bundle:
            files = {info.filename: bundle.read(info) for info in bundle.infolist()}
        self.uploads.append((str(artifact.name), files))
        return {"name": artifact.name}

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.uploads]


@pytest.fixture
def client() -> RecordingClient:
    return RecordingClient()


def watcher(
    tmp_path: Path,
    client: RecordingClient,
    stable_for: float = 0.2,
    recheck_for: float = 300.0,
    said: list[str] | None = None,
    record: Path | None = None,
) -> CheckpointWatcher:
    (tmp_path / "output-checkpoint").mkdir(exist_ok=True)
    return CheckpointWatcher(
        client,  # type: ignore[arg-type]
        "job-1",
        "node-1",
        tmp_path / "output-checkpoint",
        stable_for=stable_for,
        interval=0.05,
        recheck_for=recheck_for,
        say=None if said is None else said.append,
        record=record,
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


def test_the_files_at_the_root_make_one_final_checkpoint_named_empty_when_the_job_ends(
    tmp_path: Path, client: RecordingClient
) -> None:
    """Where the Hugging Face Trainer saves its final model: FlexAI names it ``""``."""
    watch = watcher(tmp_path, client)
    root = tmp_path / "output-checkpoint"
    (root / "config.json").write_text('{"architectures": ["BertModel"]}')
    (root / "model.safetensors").write_bytes(b"tensor")
    (root / ".partial").write_bytes(b"half")
    (root / "checkpoint-1").mkdir()
    (root / "checkpoint-1" / "w").write_bytes(b"w")
    watch.scan()
    watch.scan()
    assert "" not in client.names  # while the job runs, the root is no checkpoint yet
    watch.finish()
    assert sorted(client.uploads) == [
        ("", {"config.json": b'{"architectures": ["BertModel"]}', "model.safetensors": b"tensor"}),
        ("checkpoint-1", {"w": b"w"}),
    ]


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


def test_a_checkpoint_not_uploaded_because_the_agent_shut_down_is_not_given_up(
    tmp_path: Path, client: RecordingClient
) -> None:
    watch = watcher(tmp_path, client)
    (tmp_path / "output-checkpoint" / "checkpoint-1").mkdir()
    (tmp_path / "output-checkpoint" / "checkpoint-1" / "w").write_bytes(b"w")
    client.away = True
    watch.finish()
    client.away = False
    watch.scan(final=True)  # as the restarted agent's watcher does
    assert client.names == ["checkpoint-1"]


def test_a_checkpoint_written_in_stages_is_uploaded_again_whole_and_the_log_says_so(
    tmp_path: Path, client: RecordingClient
) -> None:
    said: list[str] = []
    watch = watcher(tmp_path, client, said=said)
    watch.start()
    staged = tmp_path / "output-checkpoint" / "checkpoint-1"
    staged.mkdir()
    (staged / "model.bin").write_bytes(b"model")
    wait_for(lambda: client.names == ["checkpoint-1"])
    (staged / "optimizer.bin").write_bytes(b"optimizer")  # the rest, after a pause
    wait_for(lambda: len(client.uploads) == 2)
    time.sleep(0.4)  # several more scans: nothing new
    watch.finish()
    assert client.uploads == [
        ("checkpoint-1", {"model.bin": b"model"}),
        ("checkpoint-1.v2", {"model.bin": b"model", "optimizer.bin": b"optimizer"}),
    ]
    assert watch.uploaded == ["checkpoint-1", "checkpoint-1.v2"]
    assert said == [
        "[agent] checkpoint checkpoint-1 changed after it was uploaded as checkpoint-1 (nothing "
        "had changed in it for 0.2 s): uploaded again, whole, as checkpoint-1.v2. Write each "
        "checkpoint under a name that starts with tmp- and rename it once complete, so it is "
        "uploaded once"
    ]


def test_a_checkpoint_that_changed_after_its_upload_is_uploaded_again_when_the_job_ends(
    tmp_path: Path, client: RecordingClient
) -> None:
    said: list[str] = []
    watch = watcher(tmp_path, client, recheck_for=0.0, said=said)  # looked at only at the end
    watch.start()
    staged = tmp_path / "output-checkpoint" / "final"
    staged.mkdir()
    (staged / "model.pt").write_bytes(b"half")
    wait_for(lambda: client.names == ["final"])
    (tmp_path / "output-checkpoint" / "final.v2").mkdir()
    (tmp_path / "output-checkpoint" / "final.v2" / "own").write_bytes(b"the job's own")
    (staged / "model.pt").write_bytes(b"whole")
    wait_for(lambda: len(client.uploads) == 2)
    time.sleep(0.4)  # final is not looked at again before the end
    assert client.names == ["final", "final.v2"]
    watch.finish()
    assert client.uploads == [
        ("final", {"model.pt": b"half"}),
        ("final.v2", {"own": b"the job's own"}),
        ("final.v3", {"model.pt": b"whole"}),
    ]
    assert len(said) == 1 and "checkpoint final changed" in said[0]
    assert "uploaded again, whole, as final.v3" in said[0]


def test_a_checkpoint_renamed_into_place_is_uploaded_once_and_one_deleted_is_not_missed(
    tmp_path: Path, client: RecordingClient
) -> None:
    said: list[str] = []
    watch = watcher(tmp_path, client, said=said)
    watch.start()
    root = tmp_path / "output-checkpoint"
    partial = root / "tmp-checkpoint-2"
    partial.mkdir()
    (partial / "model.bin").write_bytes(b"model")
    time.sleep(0.4)  # a pause longer than stable_for: still not taken
    (partial / "optimizer.bin").write_bytes(b"optimizer")
    partial.rename(root / "checkpoint-2")
    wait_for(lambda: client.uploads)
    time.sleep(0.4)
    (root / "checkpoint-2" / "model.bin").unlink()  # rotated away, as trainers do
    (root / "checkpoint-2" / "optimizer.bin").unlink()
    (root / "checkpoint-2").rmdir()
    watch.finish()
    assert client.uploads == [
        ("checkpoint-2", {"model.bin": b"model", "optimizer.bin": b"optimizer"})
    ]
    assert said == []


def test_an_agent_restarted_while_the_job_ran_uploads_what_changed_meanwhile_and_no_more(
    tmp_path: Path, client: RecordingClient
) -> None:
    """The watcher of the restarted agent reads what the first one uploaded from the record in
    the agent's scratch folder: a checkpoint finished while the agent was down is uploaded
    again as NAME.v2, one that did not change is not offered again."""
    record = tmp_path / "scratch" / "checkpoints.json"
    said: list[str] = []
    first = watcher(tmp_path, client, record=record)
    first.start()
    folder = tmp_path / "output-checkpoint"
    (folder / "checkpoint-1").mkdir()
    (folder / "checkpoint-1" / "model.bin").write_bytes(b"model")
    (folder / "checkpoint-2").mkdir()
    (folder / "checkpoint-2" / "w").write_bytes(b"second")
    wait_for(lambda: sorted(client.names) == ["checkpoint-1", "checkpoint-2"])
    first.stop_watching()  # the agent stops; the job runs on and finishes checkpoint-1
    (folder / "checkpoint-1" / "optimizer.bin").write_bytes(b"optimizer")

    again = watcher(tmp_path, client, record=record, said=said)
    again.start()
    wait_for(lambda: len(client.uploads) == 3)
    time.sleep(0.4)  # several more scans: nothing new
    again.finish()
    assert client.uploads[2:] == [
        ("checkpoint-1.v2", {"model.bin": b"model", "optimizer.bin": b"optimizer"})
    ]
    assert len(said) == 1 and "uploaded again, whole, as checkpoint-1.v2" in said[0]


def test_an_unreadable_checkpoint_record_offers_each_checkpoint_again(
    tmp_path: Path, client: RecordingClient, caplog: pytest.LogCaptureFixture
) -> None:
    record = tmp_path / "checkpoints.json"
    record.write_text("{not json")
    (tmp_path / "output-checkpoint" / "checkpoint-1").mkdir(parents=True)
    (tmp_path / "output-checkpoint" / "checkpoint-1" / "w").write_bytes(b"model")
    watch = watcher(tmp_path, client, record=record)
    watch.finish()
    assert client.names == ["checkpoint-1"]
    assert "checkpoint record" in caplog.text and "unreadable" in caplog.text


def test_a_checkpoint_named_at_the_length_limit_is_uploaded_again_under_a_name_that_fits(
    tmp_path: Path, client: RecordingClient
) -> None:
    name = "c" * 254
    staged = tmp_path / "output-checkpoint" / name
    staged.mkdir(parents=True)
    (staged / "w").write_bytes(b"half")
    watch = watcher(tmp_path, client, recheck_for=0.0)
    watch.scan(final=True)
    (staged / "w").write_bytes(b"whole")
    watch.finish()
    assert client.names == [name, "c" * 252 + ".v2"]
