"""Outputs and checkpoints zipped as a stream: what compresses is deflated, what does not is
stored, the archive reads back whole, and nothing but the job's plain files goes in."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

from node_agent.artifacts.zipping import files_bytes, write_zip


class Pipe:
    """A writer with no tell and no seek, like an upload's parts."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> int:
        self.data += data
        return len(data)

    def flush(self) -> None:
        pass


def zipped(source: Path, trusted: Path) -> zipfile.ZipFile:
    sink = Pipe()
    write_zip(source, sink, trusted=trusted)
    return zipfile.ZipFile(io.BytesIO(bytes(sink.data)))


def test_random_bytes_are_stored_and_text_is_deflated(tmp_path: Path) -> None:
    output = tmp_path / "output"
    output.mkdir()
    weights = os.urandom(600_000)
    (output / "weights.bin").write_bytes(weights)
    (output / "log.txt").write_text("epoch 1 loss 0.5\n" * 40_000)

    with zipped(output, tmp_path) as archive:
        methods = {info.filename: info.compress_type for info in archive.infolist()}
        assert methods == {"log.txt": zipfile.ZIP_DEFLATED, "weights.bin": zipfile.ZIP_STORED}
        assert archive.getinfo("log.txt").compress_size < 680_000 / 10
        assert archive.read("weights.bin") == weights


def test_the_streamed_archive_reads_back_with_every_file_and_empty_folder(tmp_path: Path) -> None:
    output = tmp_path / "output"
    (output / "metrics" / "deep").mkdir(parents=True)
    (output / "empty").mkdir()
    (output / "model.txt").write_text("final weights")
    (output / "metrics" / "deep" / "eval.json").write_text('{"accuracy": 0.9}')
    (output / "nothing.bin").write_bytes(b"")

    with zipped(output, tmp_path) as archive:
        assert archive.testzip() is None
        assert sorted(archive.namelist()) == [
            "empty/", "metrics/deep/eval.json", "model.txt", "nothing.bin",
        ]  # fmt: skip
        assert archive.read("metrics/deep/eval.json") == b'{"accuracy": 0.9}'
    assert files_bytes(output) == len("final weights") + len('{"accuracy": 0.9}')


def test_one_file_is_zipped_under_its_own_name(tmp_path: Path) -> None:
    (tmp_path / "final.pt").write_bytes(b"tensor")
    with zipped(tmp_path / "final.pt", tmp_path) as archive:
        assert archive.namelist() == ["final.pt"]
        assert archive.read("final.pt") == b"tensor"


def test_links_and_fifos_are_left_out_and_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "agent-token"
    secret.write_text("the agent's token")
    output = tmp_path / "job" / "output"
    output.mkdir(parents=True)
    (output / "kept.txt").write_text("mine")
    (output / "token-link").symlink_to(secret)
    (output / "folder-link").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(output / "pipe")

    with zipped(output, tmp_path / "job") as archive:
        assert archive.namelist() == ["kept.txt"]
        assert not any(b"the agent's token" in archive.read(name) for name in archive.namelist())
    assert files_bytes(output) == 4


def test_an_empty_output_directory_zips_to_an_empty_archive(tmp_path: Path) -> None:
    (tmp_path / "output").mkdir()
    with zipped(tmp_path / "output", tmp_path) as archive:
        assert archive.namelist() == []
