"""The agent meets hostile input safely: an input checkpoint whose archive would unpack outside
its directory fails the build and writes nothing; a repository URL that git would read as an
option or a transport helper is refused, and git itself may use no transport helper."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from node_agent.build.builder import BuildCaches, BuildFailed, JobBuild, _git_env
from node_agent.build.unpack import ArchiveRefused, UnpackLimits, unpack
from node_agent.jobdirs import JobDirs
from node_agent.models import JobSpec
from tests.support import make_repo


def zip_bytes(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name), data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return buffer.getvalue()


def tree(root: Path, leaving_out: Path) -> set[str]:
    """Every path under ``root`` but those under ``leaving_out`` (the agent's work dir)."""
    found = set()
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if Path(folder, name) != leaving_out]
        found.update(str(Path(folder, name).relative_to(root)) for name in subfolders + files)
    return found


class Node:
    """An agent's work dir three levels below ``root``, and a job's repository beside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.work_dir = root / "a" / "b" / "agent"
        self.work_dir.mkdir(parents=True)
        self.repo = make_repo(root / "origin", {"requirements.txt": "", "train.py": "pass\n"})

    def build(self, url: str | None = None, checkpoint: bytes | None = None,
              caches: bool = False) -> tuple[JobDirs, list[str]]:  # fmt: skip
        dirs = JobDirs.for_job(self.work_dir, "job-1")
        dirs.create_fresh()
        lines: list[str] = []

        def fetch(checkpoint_id: str, destination: Path) -> None:
            destination.write_bytes(checkpoint or b"")

        spec = JobSpec(repository_url=url or str(self.repo), entry_point=("train.py",))
        JobBuild(spec, dirs, log=lines.append, input_checkpoint_id="ck" if checkpoint else None,
                 fetch_checkpoint=fetch,
                 caches=BuildCaches.in_work_dir(self.work_dir) if caches else None).run()
        return dirs, lines


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


SLIPS = [
    pytest.param({"../../../../escape.txt": b"x"}, None, "would land outside", id="dot-dot"),
    pytest.param({"/tmp/escape-abs.txt": b"x"}, None, "would land outside", id="absolute"),
    pytest.param({"ok/../../escape.txt": b"x"}, None, "would land outside", id="inner-dot-dot"),
    pytest.param({"..\\..\\escape.txt": b"x"}, None, "would land outside", id="backslash"),
    pytest.param({}, {"link": "/etc/passwd"}, "link", id="symlink"),
    pytest.param({"a.txt": b"fine"}, {"../escape-link": "/etc"}, "link", id="link-climbing"),
]


@pytest.mark.parametrize(("files", "links", "said"), SLIPS)
def test_an_input_checkpoint_that_would_unpack_outside_its_directory_fails_the_build(
    node: Node, files: dict[str, bytes], links: dict[str, str] | None, said: str
) -> None:
    before = tree(node.root, node.work_dir)
    with pytest.raises(BuildFailed) as failed:
        node.build(checkpoint=zip_bytes(files, links))
    assert failed.value.code == "checkpoint_invalid"
    assert said in failed.value.message and "--checkpoint" in failed.value.message
    dirs = JobDirs.for_job(node.work_dir, "job-1")
    assert list(dirs.input_checkpoint.rglob("*")) == []
    assert tree(node.root, node.work_dir) == before
    assert not Path("/tmp/escape-abs.txt").exists()


def test_a_safe_input_checkpoint_is_unpacked_with_plain_files_only(node: Node) -> None:
    dirs, _ = node.build(checkpoint=zip_bytes({"weights/model.bin": b"\x00\x01", "dir/": b""}))
    assert (dirs.input_checkpoint / "weights" / "model.bin").read_bytes() == b"\x00\x01"
    assert (dirs.input_checkpoint / "dir").is_dir()


def test_an_archive_is_checked_whole_before_a_byte_is_written(tmp_path: Path) -> None:
    archive = tmp_path / "mixed.zip"
    archive.write_bytes(zip_bytes({"first.txt": b"x", "../second.txt": b"y"}))
    with pytest.raises(ArchiveRefused, match="'../second.txt' would land outside"):
        unpack(archive, tmp_path / "out", UnpackLimits(), "the checkpoint")
    assert list((tmp_path / "out").iterdir()) == []
    assert not (tmp_path / "second.txt").exists()


@pytest.mark.parametrize(
    "url",
    ["--upload-pack=touch pwned", "-c", "ext::sh -c touch% pwned", "fd::3", "ext::sh"],
)
@pytest.mark.parametrize("caches", [False, True], ids=["plain", "mirrored"])
def test_a_repository_url_git_would_read_as_an_option_or_a_command_fails_the_build(
    node: Node, url: str, caches: bool
) -> None:
    before = tree(node.root, node.work_dir)
    with pytest.raises(BuildFailed) as failed:
        node.build(url=url, caches=caches)
    assert failed.value.code == "clone_failed"
    assert "refused to clone" in failed.value.message and "https://" in failed.value.message
    assert tree(node.root, node.work_dir) == before
    assert not list(node.work_dir.rglob("pwned"))


def test_git_run_by_the_agent_refuses_transport_helpers_even_for_a_url_that_slipped_through(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "pwned"
    env = _git_env()
    env["GIT_CONFIG_GLOBAL"] = str(tmp_path / "gitconfig")  # a config that would allow ext
    (tmp_path / "gitconfig").write_text("[protocol]\n\tallow = always\n")
    result = subprocess.run(
        ["git", "clone", "--", f"ext::sh -c touch% {marker}", str(tmp_path / "clone")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0 and "not allowed" in result.stderr
    assert not marker.exists()


def test_git_still_clones_a_local_path_under_the_allowed_protocols(node: Node) -> None:
    dirs, lines = node.build()
    assert (dirs.repo / "train.py").is_file()
    assert any("checked out commit" in line for line in lines)
