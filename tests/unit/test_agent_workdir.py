"""The agent's work directory on the filesystem: the hint that spreads each job's files."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

import pytest

from node_agent import workdir


def flags(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        buffer = bytearray(4)
        fcntl.ioctl(fd, workdir.FS_IOC_GETFLAGS, buffer)
        return int.from_bytes(buffer, sys.byteorder)
    finally:
        os.close(fd)


def test_jobs_and_scratch_are_marked_as_tops_of_hierarchies_where_the_filesystem_can(
    tmp_path: Path,
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    if not workdir.mark_top_of_hierarchy(probe):
        pytest.skip(f"the filesystem of {tmp_path} has no top-of-hierarchy flag (chattr +T)")
    agent_dir = tmp_path / "agent"
    with workdir.exclusive(agent_dir, jobs_run_as_another_user=False):
        for name in ("jobs", "scratch"):
            assert flags(agent_dir / name) & workdir.FS_TOPDIR_FL, name
        assert not flags(agent_dir) & workdir.FS_TOPDIR_FL
    before = flags(agent_dir / "jobs")
    with workdir.exclusive(agent_dir, jobs_run_as_another_user=False):  # a restart
        assert flags(agent_dir / "jobs") == before  # the other flags kept, nothing toggled


def test_a_filesystem_without_the_flag_or_a_missing_directory_is_no_error(
    tmp_path: Path,
) -> None:
    assert workdir.mark_top_of_hierarchy(tmp_path / "missing") is False
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        folder = shm / f"flexai-topdir-{os.getpid()}"
        folder.mkdir()
        try:
            marked = workdir.mark_top_of_hierarchy(folder)
            try:
                present = bool(flags(folder) & workdir.FS_TOPDIR_FL)
            except OSError:  # no flags at all there
                present = False
            assert marked is present  # what it answers is what the filesystem holds
        finally:
            folder.rmdir()
