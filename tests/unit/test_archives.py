"""Zip archives as the control plane reads them: checkpoints described from their files, and
what is not a zip refused (the stores' own behaviour: tests/integration/test_artifact_*.py)."""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import pytest

from api.artifacts.archives import (
    ArchiveLimits,
    InvalidArchive,
    check_output,
    describe_checkpoint,
)


def zip_of(files: dict[str, bytes | str | dict[str, Any]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            if isinstance(content, dict):
                content = json.dumps(content)
            archive.writestr(name, content)
    return buffer.getvalue()


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


def test_a_checkpoint_is_described_from_trainer_state_and_config() -> None:
    data = zip_of({
        "checkpoint-500/trainer_state.json": TRAINER_STATE,
        "checkpoint-500/config.json": CONFIG,
        "checkpoint-500/model.safetensors": b"\0" * 100,
    })  # fmt: skip
    metadata = describe_checkpoint(io.BytesIO(data))
    assert metadata["step"] == 500
    assert metadata["train_loss"] == 0.4
    assert metadata["eval_loss"] == 0.5
    assert metadata["model"] == "GPT2LMHeadModel"
    assert metadata["version"] == "4.44.0"
    assert metadata["inference_ready"] is True
    assert metadata["size"] >= 100


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


def test_bytes_that_are_not_a_zip_are_refused_as_an_archive() -> None:
    with pytest.raises(InvalidArchive, match="not a zip archive"):
        describe_checkpoint(b"these are not the bytes of a zip")
    with pytest.raises(InvalidArchive, match="not a zip archive"):
        check_output(io.BytesIO(b"nor these"), ArchiveLimits())


def test_an_output_with_an_entry_outside_its_directory_is_refused() -> None:
    with pytest.raises(InvalidArchive, match="leaves the output directory"):
        check_output(io.BytesIO(zip_of({"../../etc/cron.d/x": "boom"})), ArchiveLimits())


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
        with bomb.open("rb") as handle:
            metadata = describe_checkpoint(handle)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20
    assert metadata["step"] is None and metadata["model"] == "BertModel"
    assert metadata["size"] > 100 * 2**20
