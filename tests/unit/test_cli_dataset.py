"""`flexai dataset`: the archive a push streams (same files, same hash), what push, list and
inspect print, and help without heavy imports."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from cli.client.api import ApiClient
from cli.commands.dataset.archive import ZipStream, scan
from cli.errors import CliError
from cli.main import main
from cli.output.datasets import render_dataset, render_datasets_table
from cli.output.jobs import job_detail
from tests.unit.test_cli_main import HEAVY, modules_loaded_by

HASH = "4706193e3ba944db56cc598e9fe6c9678292e87512332625dc334bef32d85229"


def archive_of(source: Path) -> tuple[bytes, ZipStream]:
    stream = ZipStream(scan(source))
    return b"".join(stream), stream


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_archive_holds_the_directorys_files_and_its_hash_is_of_what_was_sent(
    tmp_path: Path,
) -> None:
    source = tree(tmp_path / "data", {"rows.csv": "a,b\n", "sub/more.txt": "more"})
    (source / "empty").mkdir()
    data, stream = archive_of(source)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert sorted(archive.namelist()) == ["empty/", "rows.csv", "sub/more.txt"]
        assert archive.read("sub/more.txt") == b"more"
    assert stream.sha256 == hashlib.sha256(data).hexdigest()
    assert stream.size == len(data)


def test_the_same_files_make_the_same_archive_whatever_their_times(tmp_path: Path) -> None:
    first = tree(tmp_path / "one", {"rows.csv": "a,b\n", "sub/more.txt": "more"})
    second = tree(tmp_path / "two", {"sub/more.txt": "more", "rows.csv": "a,b\n"})
    os.utime(second / "rows.csv", (0, 0))
    assert archive_of(first)[1].sha256 == archive_of(second)[1].sha256
    (second / "rows.csv").write_text("a,c\n")
    assert archive_of(first)[1].sha256 != archive_of(second)[1].sha256


def test_a_single_file_is_pushed_under_its_own_name(tmp_path: Path) -> None:
    source = tmp_path / "weights.bin"
    source.write_bytes(b"\x00\x01")
    data, _ = archive_of(source)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.namelist() == ["weights.bin"]


def test_links_to_directories_are_left_out_and_links_to_files_are_followed(
    tmp_path: Path,
) -> None:
    source = tree(tmp_path / "data", {"rows.csv": "a,b\n"})
    (source / "loop").symlink_to(source, target_is_directory=True)
    (source / "alias.csv").symlink_to(source / "rows.csv")
    scanned = scan(source)
    assert scanned.left_out == ["loop"]
    assert [entry.name for entry in scanned.entries] == ["alias.csv", "rows.csv"]


@pytest.mark.parametrize("what", ["missing", "empty"])
def test_nothing_to_push_is_one_clear_error(tmp_path: Path, what: str) -> None:
    source = tmp_path / "data"
    if what == "empty":
        (source / "sub").mkdir(parents=True)
    with pytest.raises(CliError) as refused:
        scan(source)
    assert str(source) in str(refused.value)


def test_push_streams_the_archive_and_shows_version_size_and_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tree(tmp_path / "data", {"rows.csv": "a,b\n", "sub/more.txt": "more"})
    sent: list[bytes] = []

    def push_dataset(self: ApiClient, name: str, archive: Iterable[bytes]) -> dict[str, Any]:
        sent.extend(archive)
        digest = hashlib.sha256(b"".join(sent)).hexdigest()
        return {"name": name, "version": 2, "content_hash": digest, "size": 9, "files": 2,
                "changed": True}  # fmt: skip

    monkeypatch.setenv("FLEXAI_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FLEXAI_TOKEN", "t")
    monkeypatch.setattr(ApiClient, "push_dataset", push_dataset)
    assert main(["dataset", "push", "mnist", str(source)]) == 0
    out = capsys.readouterr().out
    assert "Pushed dataset mnist version 2: 2 files, 9 B" in out
    assert f"sha256 {hashlib.sha256(b''.join(sent)).hexdigest()}" in out
    assert "-D mnist" in out and len(sent) >= 1


def test_push_refuses_a_name_outside_the_rule_before_reading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dataset", "push", "../etc", str(tmp_path)]) == 2
    assert "dataset name '../etc' is not valid: use 1 to 128" in capsys.readouterr().err


def test_list_is_a_table_with_a_short_hash() -> None:
    table = render_datasets_table([{"name": "mnist", "size": 1536, "files": 2,
                                    "content_hash": HASH, "pushed_at": None}])  # fmt: skip
    header, row = table.splitlines()
    assert header.split() == ["NAME", "SIZE", "FILES", "HASH", "PUSHED"]
    assert row.split() == ["mnist", "1.5", "KiB", "2", HASH[:12], "-"]


def test_inspect_shows_every_version_newest_first() -> None:
    version = {"size": 9, "files": 2, "pushed_at": None, "pushed_by": "alice"}
    shown = render_dataset({
        "name": "mnist", "version": 2, "content_hash": HASH, "size": 9, "files": 2,
        "versions": [{"version": 2, "content_hash": HASH, **version},
                     {"version": 1, "content_hash": "0" * 64, **version}],
    })  # fmt: skip
    assert f"content hash: {HASH}" in shown
    lines = [line for line in shown.splitlines() if line.startswith("  - ")]
    assert [line.split()[1:3] for line in lines] == [
        ["VERSION", "HASH"],
        ["2", HASH[:12]],
        ["1", "0" * 12],
    ]


def test_a_jobs_inspect_shows_the_version_each_dataset_was_pinned_to() -> None:
    spec = {"datasets": ["mnist", "local"], "dataset_hashes": {"mnist": HASH}}
    assert job_detail({"spec": spec})["spec"]["datasets"] == [f"mnist @ {HASH[:12]}", "local"]


@pytest.mark.parametrize("argv", [["dataset", "--help"], ["dataset", "push", "--help"]])
def test_dataset_help_imports_nothing_heavy(argv: list[str]) -> None:
    code, out, loaded = modules_loaded_by(argv)
    assert code == 0 and "usage: flexai dataset" in out
    assert loaded.isdisjoint(HEAVY), loaded & set(HEAVY)
