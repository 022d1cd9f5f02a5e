"""The command line that runs a job's process in its sandbox: bubblewrap (``bwrap``, as root)
sets up the namespaces and mounts, ``setpriv`` drops to the job's own id, and a shell joins
the job's cgroup first, so everything the job starts is counted and ended with it.

Inside, the job sees:

- its own processes only (PID, IPC and UTS namespaces; the host's network, for multi-node
  jobs, pip and the datasets' hosts);
- the host's root, read-only, with private ``/tmp``, ``/dev/shm`` and ``/run`` (the host's
  sockets are not its); ``/dev`` with the usual nodes and the device nodes of its own GPUs only
  (and the control nodes CUDA needs);
- the agent's work directory hidden, but for the job's own folder (writable: its repository,
  venv and home) and what its venv reads (the cached environments, read-only);
- the platform's paths: ``/output`` and ``/output-checkpoint`` (writable), ``/input/<dataset>``
  and ``/input-checkpoint`` (read-only).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from node_agent.jobdirs import JobDirs

OUTPUT, OUTPUT_CHECKPOINT = "/output", "/output-checkpoint"
INPUT, INPUT_CHECKPOINT = "/input", "/input-checkpoint"
PLATFORM_DIRS = {
    "FLEXAI_OUTPUT_DIR": OUTPUT,
    "FLEXAI_OUTPUT_CHECKPOINT_DIR": OUTPUT_CHECKPOINT,
    "FLEXAI_INPUT_CHECKPOINT_DIR": INPUT_CHECKPOINT,
    "FLEXAI_INPUT_DIR": INPUT,
}
"""The job's ``FLEXAI_*_DIR`` variables inside its sandbox: the platform's own paths."""
PRIVATE_TMP = {"TMPDIR": "/tmp"}
"""Temporary files go to the sandbox's own /tmp, whatever the agent's TMPDIR names (the host's
folders are read-only there)."""
GPU_CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
               "/dev/nvidia-modeset", "/dev/nvidia-caps")  # fmt: skip
_HIDDEN_TOP = {"proc", "dev", "sys", "tmp", "run"}
_RUN_KEPT = ("/run/systemd/resolve",)
"""The host's top-level entries the sandbox replaces with its own."""
_JOIN_CGROUP = ('IFS=:; for f in $FLEXAI_CGROUP_PROCS; do echo $$ > "$f" || exit 125; done; '
                'unset FLEXAI_CGROUP_PROCS IFS; exec "$@"')  # fmt: skip


def bwrap_binary() -> str | None:
    return shutil.which("bwrap")


def _passable(folder: Path, uid: int) -> bool:
    """Whether ``uid`` (with no group) may pass through ``folder`` on the host."""
    try:
        status = folder.stat()
    except OSError:
        return True  # nothing there: the sandbox makes it
    if uid == 0:
        return True
    bit = stat.S_IXUSR if status.st_uid == uid else stat.S_IXOTH
    return bool(status.st_mode & bit)


@dataclass(frozen=True)
class JobSandbox:
    """How one job's processes are sandboxed on this node."""

    dirs: JobDirs
    uid: int
    work_dir: Path
    bwrap: str
    hostname: str = "job"
    datasets: Mapping[str, Path] = field(default_factory=dict)
    """Mount name -> the dataset's directory on this node (shown at ``/input/<name>``)."""
    devices: tuple[str, ...] = ()
    """The device nodes of the job's accelerators (``/dev/nvidia2``)."""
    cgroup_procs: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()
    """Paths of the work directory the job reads (the shim, the cached environments)."""

    def platform_env(self) -> dict[str, str]:
        return dict(PLATFORM_DIRS)

    def command(self, argv: Sequence[str], *, cwd: Path, entry: bool = False,
                writable: Sequence[Path] = (), info_fd: int | None = None
                ) -> list[str]:  # fmt: skip
        """``argv`` in the sandbox from ``cwd``. ``entry``: the entry point's shim, which is
        the sandbox's first process (its end ends every process left there) in a session of
        its own, and outlives the agent; else a build step, ended with the agent's command
        that started it. ``writable``: more of the work directory it may write (a build's
        staging environment). ``info_fd``: where bubblewrap writes the process's pid on this
        host (``{"child-pid": N}``) once the sandbox is set up."""
        options = [*self._root(), *self._job_files(writable), *self._devices()]
        options += ["--unshare-pid", "--unshare-ipc", "--unshare-uts",
                    "--hostname", self.hostname, "--chdir", str(cwd), "--remount-ro", "/"]
        options += ["--as-pid-1", "--new-session"] if entry else ["--die-with-parent"]
        if info_fd is not None:
            options += ["--info-fd", str(info_fd)]
        sandboxed = [self.bwrap, *options, "--", *self._drop(), *argv]
        if not self.cgroup_procs:
            return sandboxed
        return ["/bin/sh", "-c", _JOIN_CGROUP, "sh", *sandboxed]

    def enter(self, pid: int, argv: Sequence[str], *, cwd: Path) -> list[str]:
        """``argv`` inside the running sandbox whose first process is ``pid`` (on this host):
        its namespaces, as the job's user, in its cgroup (a debug session's shell)."""
        entered = ["nsenter", f"--target={pid}", "--pid", "--mount", "--uts", "--ipc",
                   f"--wd={cwd}", "--", *self._drop(), *argv]  # fmt: skip
        if not self.cgroup_procs:
            return entered
        return ["/bin/sh", "-c", _JOIN_CGROUP, "sh", *entered]

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The process's environment in the sandbox, with the cgroup it joins first."""
        if not self.cgroup_procs:
            return {**env, **PRIVATE_TMP}
        return {**env, **PRIVATE_TMP,
                "FLEXAI_CGROUP_PROCS": ":".join(map(str, self.cgroup_procs))}  # fmt: skip

    def _drop(self) -> list[str]:
        """To the job's id, with no group, capability or way back of the agent's."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]

    def _root(self) -> list[str]:
        """The host's root, read-only, on a tmpfs where the platform's paths can be made."""
        options = ["--tmpfs", "/"]
        for entry in sorted(os.scandir("/"), key=lambda e: e.name):
            if entry.name in _HIDDEN_TOP:
                continue
            if entry.is_symlink():
                options += ["--symlink", os.readlink(entry.path), entry.path]
            elif entry.is_dir(follow_symlinks=False):
                options += ["--ro-bind", entry.path, entry.path]
        options += ["--ro-bind", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev",
                    "--perms", "1777", "--tmpfs", "/dev/shm", "--perms", "1777", "--tmpfs",
                    "/tmp", "--tmpfs", "/run"]  # fmt: skip
        for kept in _RUN_KEPT:  # /etc/resolv.conf may name the host's resolver's stub there
            options += ["--ro-bind-try", kept, kept]
        return options

    def _job_files(self, writable: Sequence[Path]) -> list[str]:
        dirs = self.dirs
        options = self._passage()
        options += ["--tmpfs", str(self.work_dir)]  # the other jobs, the agent's files: hidden
        for path in (*self.readable, dirs.root, *writable):  # passable on the way (not 0700)
            options += self._parents(path)
        for path in self.readable:
            options += ["--ro-bind-try", str(path), str(path)]
        options += ["--bind", str(dirs.root), str(dirs.root)]
        for path in writable:
            options += ["--bind", str(path), str(path)]
        options += ["--bind", str(dirs.output), OUTPUT,
                    "--bind", str(dirs.output_checkpoint), OUTPUT_CHECKPOINT,
                    "--ro-bind", str(dirs.input_checkpoint), INPUT_CHECKPOINT,
                    "--dir", INPUT]  # fmt: skip
        for name, path in sorted(self.datasets.items()):
            options += ["--ro-bind", str(path), f"{INPUT}/{name}"]
        return options

    def _passage(self) -> list[str]:
        """A work directory below a folder the job's id may not pass (root's home, 0700): that
        folder is an empty tmpfs in the sandbox (the job could see nothing of it anyway), with
        the way down to the work directory made in it."""
        blocked = next((folder for folder in reversed(self.work_dir.parents)
                        if folder != Path("/") and not _passable(folder, self.uid)),
                       None)  # fmt: skip
        if blocked is None:
            return []
        options = ["--tmpfs", str(blocked)]
        for folder in reversed(self.work_dir.parents):
            if folder.is_relative_to(blocked) and folder != blocked:
                options += ["--perms", "0755", "--dir", str(folder)]
        return options

    def _parents(self, path: Path) -> list[str]:
        """The folders between the work directory and ``path``, made passable by anyone."""
        options: list[str] = []
        for parent in reversed(path.parents):
            if parent.is_relative_to(self.work_dir) and parent != self.work_dir:
                options += ["--perms", "0755", "--dir", str(parent)]
        return options

    def _devices(self) -> list[str]:
        options: list[str] = []
        for node in (*self.devices, *GPU_CONTROL):
            if os.path.exists(node):
                options += ["--dev-bind", node, node]
        return options
