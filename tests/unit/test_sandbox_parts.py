"""The parts of a job's sandbox, without running one. Its cgroup on both layouts, against a
cgroup tree laid out in a temporary folder as the kernel lays it out (the real one on these
machines is v1; hosts with v2 are the common case): which hierarchy a job's cgroup goes in,
the limits it gets, how the OOM killer's count is read, and what the agent says when the host
gives it no cgroup. And bubblewrap's command line: the paths, devices and cgroup it gives."""

from __future__ import annotations

from pathlib import Path

from node_agent.sandbox.cgroups import Cgroups, detect


def v2_tree(root: Path, own: str = "system.slice/flexai-agent.service") -> Path:
    """A cgroup v2 mount whose agent cgroup was delegated ``memory`` and ``pids``."""
    (root / "cgroup.controllers").write_text("cpu memory pids io\n")
    base = root / own
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("memory pids\n")
    (base / "cgroup.subtree_control").write_text("")
    (base / "cgroup.procs").write_text("4242\n")
    return base


def test_on_v2_the_agent_moves_to_a_leaf_and_jobs_get_memory_and_pids_limits(
    tmp_path: Path,
) -> None:
    base = v2_tree(tmp_path)
    own = tmp_path / "self-cgroup"
    own.write_text("0::/system.slice/flexai-agent.service\n")
    found = detect(tmp_path, own)
    assert isinstance(found, Cgroups) and found.version == 2 and found.bases == (base,)
    assert (base / "flexai-agent" / "cgroup.procs").read_text() == "4242"
    assert (base / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (base / "flexai-jobs" / "cgroup.subtree_control").read_text() == "+memory +pids"

    cgroup = found.for_job("job-1-0")
    job = base / "flexai-jobs" / "job-1-0"
    job.mkdir()
    for name in ("memory.max", "memory.swap.max", "pids.max"):
        (job / name).write_text("max\n")
    cgroup.create(2**30, 512)
    assert (job / "memory.max").read_text() == str(2**30)
    assert (job / "memory.swap.max").read_text() == "0"
    assert (job / "pids.max").read_text() == "512"
    assert cgroup.procs_files == (job / "cgroup.procs",)
    assert cgroup.memory_limit() == 2**30
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert cgroup.oom_kills() == 1


def test_on_v2_an_agent_not_given_the_controllers_says_how_to_delegate_them(
    tmp_path: Path,
) -> None:
    base = v2_tree(tmp_path)
    (base / "cgroup.controllers").write_text("cpu\n")
    own = tmp_path / "self-cgroup"
    own.write_text("0::/system.slice/flexai-agent.service\n")
    said = detect(tmp_path, own)
    assert said == (f"cgroup v2: {base} is not given the memory and pids controllers (delegate "
                    "them to the agent, e.g. systemd's Delegate=yes)")  # fmt: skip


def test_on_v1_a_job_gets_a_cgroup_in_the_memory_and_the_pids_hierarchies(
    tmp_path: Path,
) -> None:
    for name in ("memory", "pids"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cgroup.procs").write_text("")
    (tmp_path / "memory" / "agents").mkdir()
    own = tmp_path / "self-cgroup"
    own.write_text("8:pids:/\n4:memory:/agents\n0::/\n")
    found = detect(tmp_path, own)
    assert isinstance(found, Cgroups) and found.version == 1
    assert found.bases == (tmp_path / "memory" / "agents", tmp_path / "pids")
    cgroup = found.for_job("job-1-0")
    memory = tmp_path / "memory" / "agents" / "flexai-jobs" / "job-1-0"
    memory.mkdir(parents=True)
    (memory / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup.memory_limit() is None  # unlimited
    cgroup.create(256 * 2**20, None)
    assert (memory / "memory.limit_in_bytes").read_text() == str(256 * 2**20)
    assert not (memory / "memory.memsw.limit_in_bytes").exists()  # swap not accounted here
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cgroup.oom_kills() == 2
    assert len(cgroup.procs_files) == 2


def test_a_host_without_cgroups_is_said_at_start(tmp_path: Path) -> None:
    own = tmp_path / "self-cgroup"
    own.write_text("0::/\n")
    assert detect(tmp_path, own) == (
        f"no cgroup v2 at {tmp_path}, and no cgroup v1 memory or pids hierarchy"
    )


def test_a_sandboxs_command_line_shows_the_job_its_own_paths_devices_and_cgroup(
    tmp_path: Path,
) -> None:
    from node_agent.jobdirs import JobDirs
    from node_agent.sandbox.bwrap import JobSandbox

    dirs = JobDirs.for_job(tmp_path / "work", "job-1")
    sandbox = JobSandbox(dirs, 70001, tmp_path / "work", "/usr/bin/bwrap",
                         datasets={"train": tmp_path / "cache" / "abc"},
                         devices=("/dev/null",),  # stands in for /dev/nvidia3
                         cgroup_procs=(tmp_path / "cg" / "cgroup.procs",))  # fmt: skip
    entry = sandbox.command(["python", "train.py"], cwd=dirs.repo, entry=True, info_fd=9)
    assert entry[:4] == ["/bin/sh", "-c", entry[2], "sh"] and "FLEXAI_CGROUP_PROCS" in entry[2]
    bwrap = entry[4:]
    pairs = {(bwrap[i], bwrap[i + 1], bwrap[i + 2]) for i in range(len(bwrap) - 2)}
    assert ("--bind", str(dirs.output), "/output") in pairs
    assert ("--ro-bind", str(tmp_path / "cache" / "abc"), "/input/train") in pairs
    assert ("--dev-bind", "/dev/null", "/dev/null") in pairs
    assert ("--tmpfs", str(tmp_path / "work"), "--perms") in pairs  # the other jobs: hidden
    assert "--as-pid-1" in bwrap and "--new-session" in bwrap and "--die-with-parent" not in bwrap
    assert bwrap[bwrap.index("--info-fd") + 1] == "9"
    after = bwrap[bwrap.index("--") + 1:]
    assert after[:2] == ["setpriv", "--reuid=70001"] and after[-2:] == ["python", "train.py"]
    assert sandbox.env({"A": "1", "TMPDIR": "/var/tmp"}) == {
        "A": "1", "TMPDIR": "/tmp",  # its own /tmp: the host's folders are read-only there
        "FLEXAI_CGROUP_PROCS": str(tmp_path / "cg" / "cgroup.procs")}  # fmt: skip
    build = sandbox.command(["pip", "install"], cwd=dirs.repo, writable=(tmp_path / "stage",))
    assert "--die-with-parent" in build and "--as-pid-1" not in build
    assert str(tmp_path / "stage") in build
    entered = sandbox.enter(4321, ["bash"], cwd=dirs.repo)
    assert "--target=4321" in entered and entered[-1] == "bash"
