"""Each job's sandbox as the supervisor asks for it: the user it runs as (its own id, or the
one ``--job-user`` named), its cgroup with its limits, and its sandbox for the build steps and,
once its accelerators are known, for its entry point."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from node_agent.jobdirs import JobDirs
from node_agent.run.jobuser import JobUser
from node_agent.sandbox.bwrap import PLATFORM_DIRS, JobSandbox
from node_agent.sandbox.cgroups import CgroupError, JobCgroup
from node_agent.sandbox.identities import ID_FILE, JobIdentities
from node_agent.sandbox.isolation import SANDBOX, Isolation

log = logging.getLogger("flexai.agent")

DEFAULT_PIDS = 4096
"""Processes (threads too) a job may have at once: a fork bomb ends in the job alone."""


@dataclass(frozen=True)
class Limits:
    memory: str = "share"
    """``share``: the job's accelerators' share of the node's memory; ``none``; or bytes."""
    pids: int | None = DEFAULT_PIDS


@dataclass(frozen=True)
class JobSandboxes:
    """What this node sandboxes jobs with."""

    isolation: Isolation
    work_dir: Path
    identities: JobIdentities | None
    """None: every job runs as the one user ``--job-user`` named."""
    limits: Limits = field(default_factory=Limits)
    node_accels: int = 1
    gpu_devices: Mapping[int, str] = field(default_factory=dict)
    """Accelerator index -> its device node (``/dev/nvidia3``)."""
    gpu_uuids: Mapping[int, str] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.isolation.level == SANDBOX and self.isolation.bwrap is not None

    def user(self, dirs: JobDirs, shared: JobUser | None, hostname: str) -> JobUser | None:
        """The user the job runs as, in its sandbox (without accelerators yet)."""
        if not self.active or self.isolation.bwrap is None:
            return shared
        sandbox = JobSandbox(dirs, 0, self.work_dir, self.isolation.bwrap, hostname[:63],
                             readable=(self.work_dir / "shim.py", self.work_dir / "envs"))
        if self.identities is not None:
            uid = self.identities.take(dirs.scratch)
            return JobUser(f"job-{uid}", uid, uid, replace(sandbox, uid=uid))
        assert shared is not None
        return shared.in_sandbox(replace(sandbox, uid=shared.uid))

    def cgroup(self, dirs: JobDirs, accels: int) -> JobCgroup | None:
        """The job's cgroup, made with its limits; None where the node has none."""
        cgroups = self.isolation.cgroups
        if not self.active or cgroups is None:
            return None
        cgroup = cgroups.for_job(dirs.marker)  # this work directory's job and node index
        try:
            cgroup.create(self.memory_limit(accels), self.limits.pids)
        except CgroupError as error:
            log.warning("job %s runs without memory and process limits: %s", dirs.root.name,
                        error)  # fmt: skip
            return None
        return cgroup

    def memory_limit(self, accels: int) -> int | None:
        if self.limits.memory == "none":
            return None
        if self.limits.memory != "share":
            return int(self.limits.memory)
        share = max(accels, 1) / max(self.node_accels, 1)
        return int(node_memory() * min(share, 1.0))

    def for_entry_point(self, user: JobUser, accelerators: Sequence[int],
                        cgroup: JobCgroup | None) -> JobUser:  # fmt: skip
        """The job's user with its sandbox as its entry point gets it: its accelerators'
        device nodes, its datasets at ``/input/<name>``, its cgroup."""
        if user.sandbox is None:
            return user
        devices = tuple(self.gpu_devices[index] for index in accelerators
                        if index in self.gpu_devices)  # fmt: skip
        return user.in_sandbox(self.with_cgroup(replace(
            user.sandbox, devices=devices, datasets=datasets_of(user.sandbox.dirs)), cgroup))

    @staticmethod
    def with_cgroup(sandbox: JobSandbox, cgroup: JobCgroup | None) -> JobSandbox:
        return replace(sandbox, cgroup_procs=cgroup.procs_files if cgroup else ())


def datasets_of(dirs: JobDirs) -> dict[str, Path]:
    """The job's datasets, as its build put them in its ``input/`` folder: name -> directory."""
    found: dict[str, Path] = {}
    if not dirs.input.is_dir():
        return found
    for entry in os.scandir(dirs.input):
        target = Path(os.path.realpath(entry.path))
        if target.is_dir():
            found[entry.name] = target
    return found


def node_memory() -> int:
    """The memory jobs share: the host's, or the agent's own cgroup limit where lower."""
    total = 0
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
    except OSError:
        pass
    return total or 2**40


@dataclass
class Confinement:
    """One job's place on this node: the user its code runs as, in its sandbox, and its
    cgroup; none of either on a node that cannot sandbox (its ``user`` is then the shared
    one)."""

    sandboxes: JobSandboxes | None
    user: JobUser | None
    cgroup: JobCgroup | None = None

    @classmethod
    def of(cls, sandboxes: JobSandboxes | None, dirs: JobDirs, shared: JobUser | None,
           hostname: str, accels: int) -> Confinement:  # fmt: skip
        if sandboxes is None or not sandboxes.active:
            return cls(sandboxes, shared)
        user = sandboxes.user(dirs, shared, hostname)
        cgroup = sandboxes.cgroup(dirs, accels)
        if user is not None and user.sandbox is not None:
            user = user.in_sandbox(JobSandboxes.with_cgroup(user.sandbox, cgroup))
        return cls(sandboxes, user, cgroup)

    @property
    def sandboxed(self) -> bool:
        return self.user is not None and self.user.sandbox is not None

    def entry_user(self, accelerators: Sequence[int], dirs: JobDirs) -> JobUser | None:
        """The user the entry point of the attempt of ``dirs`` runs as, in its sandbox."""
        if self.sandboxes is None or self.user is None or self.user.sandbox is None:
            return self.user
        user = self.user.in_sandbox(replace(self.user.sandbox, dirs=dirs))
        return self.sandboxes.for_entry_point(user, accelerators, self.cgroup)

    def entry_env(self, env: Mapping[str, str], accelerators: Sequence[int]) -> dict[str, str]:
        """The entry point's environment in its sandbox: the platform's paths, and its GPUs
        by UUID where they are known (the sandbox shows no other GPU's device)."""
        if not self.sandboxed or self.sandboxes is None:
            return dict(env)
        uuids = [self.sandboxes.gpu_uuids.get(index) for index in accelerators]
        chosen = {"CUDA_VISIBLE_DEVICES": ",".join(u for u in uuids if u)} \
            if uuids and all(uuids) else {}  # fmt: skip
        return {**env, **PLATFORM_DIRS, **chosen}

    def out_of_memory(self) -> str | None:
        """What to say when the kernel's OOM killer ended a process of the job; None when it
        did not."""
        if self.cgroup is None or self.cgroup.oom_kills() == 0 or self.sandboxes is None:
            return None
        limit = self.cgroup.memory_limit()
        size = ("the node's" if not limit else f"{limit / 2**30:.1f} GiB" if limit >= 2**30
                else f"{limit // 2**20} MiB")  # fmt: skip
        return (f"the job used more than its memory limit ({size}) and the kernel's OOM killer "
                "ended it; give it more accelerators (its limit is their share of the node's "
                "memory) or make it use less")  # fmt: skip

    def close(self, dirs: JobDirs, kept: bool) -> None:
        """Once the job's processes are done with: nothing of it outlives its cgroup, and its
        id is free for another job; its folders, ``kept``, are handed back to the agent."""
        if self.cgroup is not None:
            self.cgroup.kill_all()
            self.cgroup.remove()
        if not self.sandboxed or self.sandboxes is None or self.sandboxes.identities is None:
            return
        if kept and dirs.root.is_dir():
            hand_back(dirs.root)
        (dirs.scratch / ID_FILE).unlink(missing_ok=True)


def hand_back(root: Path) -> None:
    """The job's folder, the agent's again (links are changed, not followed)."""
    uid, gid = os.geteuid(), os.getegid()
    for folder, subfolders, files in os.walk(root):
        for name in (*subfolders, *files):
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)
    os.chown(root, uid, gid, follow_symlinks=False)
