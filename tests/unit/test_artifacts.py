"""The artifact store: logs appended once in order, checkpoints described from their files."""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import pytest

from api.artifacts.store import (
    InvalidArchive,
    LocalArtifactStore,
    LogOffsetMismatch,
    describe_checkpoint,
)

JOB = "job-1"


@pytest.fixture
def store(tmp_path: Path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "artifacts")


def zip_of(files: dict[str, bytes | str | dict[str, Any]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            if isinstance(content, dict):
                content = json.dumps(content)
            archive.writestr(name, content)
    return buffer.getvalue()


# -- logs ----------------------------------------------------------------------------------


def test_log_bytes_are_appended_in_order(store: LocalArtifactStore) -> None:
    assert store.append_log(JOB, 0, b"epoch 1\n") == 8
    assert store.append_log(JOB, 8, b"epoch 2\n") == 16
    assert store.read_log(JOB, 0) == b"epoch 1\nepoch 2\n"
    assert store.read_log(JOB, 8) == b"epoch 2\n"


def test_a_resend_of_bytes_already_held_is_acknowledged_not_written_twice(
    store: LocalArtifactStore,
) -> None:
    store.append_log(JOB, 0, b"epoch 1\nepoch 2\n")
    assert store.append_log(JOB, 0, b"epoch 1\n") == 16
    assert store.append_log(JOB, 8, b"epoch 2\n") == 16
    assert store.read_log(JOB, 0) == b"epoch 1\nepoch 2\n"


def test_a_partly_overlapping_send_appends_only_the_new_tail(store: LocalArtifactStore) -> None:
    store.append_log(JOB, 0, b"epoch 1\n")
    assert store.append_log(JOB, 4, b"h 1\nepoch 2\n") == 16
    assert store.read_log(JOB, 0) == b"epoch 1\nepoch 2\n"


def test_bytes_sent_past_the_end_are_refused_with_the_offset_to_resend_from(
    store: LocalArtifactStore,
) -> None:
    store.append_log(JOB, 0, b"epoch 1\n")
    with pytest.raises(LogOffsetMismatch) as refused:
        store.append_log(JOB, 20, b"epoch 3\n")
    assert refused.value.expected == 8
    assert "offset 8" in str(refused.value)
    assert store.read_log(JOB, 0) == b"epoch 1\n"


def test_a_job_without_logs_reads_empty(store: LocalArtifactStore) -> None:
    assert store.log_size(JOB) == 0
    assert store.read_log(JOB, 0) == b""
    with pytest.raises(LogOffsetMismatch) as refused:
        store.append_log(JOB, 1, b"x")
    assert refused.value.expected == 0


# -- checkpoints ---------------------------------------------------------------------------


TRAINER_STATE = {
    "global_step": 500,
    "log_history": [
        {"step": 250, "loss": 0.9},
        {"step": 500, "loss": 0.4},
        {"step": 500, "eval_loss": 0.5},
    ],
}
CONFIG = {"architectures": ["GPT2LMHeadModel"], "transformers_version": "4.44.0"}


def test_a_checkpoint_is_described_from_trainer_state_and_config(
    store: LocalArtifactStore,
) -> None:
    data = zip_of({
        "checkpoint-500/trainer_state.json": TRAINER_STATE,
        "checkpoint-500/config.json": CONFIG,
        "checkpoint-500/model.safetensors": b"\0" * 100,
    })  # fmt: skip
    metadata = store.save_checkpoint(JOB, "ck-1", data)
    assert metadata["step"] == 500
    assert metadata["train_loss"] == 0.4
    assert metadata["eval_loss"] == 0.5
    assert metadata["model"] == "GPT2LMHeadModel"
    assert metadata["version"] == "4.44.0"
    assert metadata["inference_ready"] is True
    assert metadata["size"] >= 100
    assert store.checkpoint_path(JOB, "ck-1").read_bytes() == data


def test_a_checkpoint_without_those_files_has_no_metadata_and_is_not_inference_ready() -> None:
    metadata = describe_checkpoint(zip_of({"weights.pt": b"\1" * 10, "notes.txt": "hi"}))
    described = ("step", "train_loss", "eval_loss", "model", "version")
    assert [metadata[key] for key in described] == [None] * len(described)
    assert metadata["inference_ready"] is False
    assert metadata["size"] == 12


def test_a_config_without_weights_is_not_inference_ready() -> None:
    metadata = describe_checkpoint(zip_of({"config.json": CONFIG}))
    assert metadata["model"] == "GPT2LMHeadModel"
    assert metadata["inference_ready"] is False


def test_unreadable_trainer_state_leaves_the_step_unknown() -> None:
    metadata = describe_checkpoint(zip_of({"trainer_state.json": "{not json"}))
    assert metadata["step"] is None and metadata["train_loss"] is None


def test_an_upload_that_is_not_a_zip_is_refused_and_not_stored(store: LocalArtifactStore) -> None:
    with pytest.raises(InvalidArchive, match="not a zip archive"):
        store.save_checkpoint(JOB, "ck-1", b"these are not the bytes of a zip")
    assert not store.checkpoint_path(JOB, "ck-1").exists()
    with pytest.raises(InvalidArchive):
        store.save_output(JOB, 0, b"nor these")
    assert not store.output_path(JOB, 0).exists()


def test_an_output_archive_is_stored_whole(store: LocalArtifactStore) -> None:
    data = zip_of({"model.pt": b"\2" * 64, "metrics.json": {"accuracy": 0.97}})
    assert store.save_output(JOB, 0, data) == len(data)
    assert store.output_path(JOB, 0).read_bytes() == data


def test_a_zip_bomb_trainer_state_is_not_unpacked_into_memory(tmp_path: Path) -> None:
    """A 100 MB trainer_state.json that zips to a few hundred KB used to be read whole."""
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("trainer_state.json", "w") as member:
            for _ in range(100):
                member.write(b" " * 2**20)
        archive.writestr("config.json", json.dumps({"architectures": ["BertModel"]}))
    assert bomb.stat().st_size < 1_000_000
    tracemalloc.start()
    try:
        metadata = describe_checkpoint(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20
    assert metadata["step"] is None and metadata["model"] == "BertModel"
    assert metadata["size"] > 100 * 2**20
