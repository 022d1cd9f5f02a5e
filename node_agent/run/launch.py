"""How a built job is launched: its command line and its environment."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from node_agent.credentials import HANDOVER_VARIABLE
from node_agent.jobdirs import JobDirs
from node_agent.models import MARKER_VARIABLE

# The agent's own settings never leak into a job (the token above all).
_AGENT_ONLY = (
    "FLEXAI_TOKEN", "FLEXAI_API_URL", "FLEXAI_CONFIG", HANDOVER_VARIABLE, "VIRTUAL_ENV",
    "PYTHONHOME", "PYTHONPATH", MARKER_VARIABLE,
)  # fmt: skip
"""The agent's own settings: its token and server, its marker, and where its own Python finds
its modules (a job's user may not even be let into that directory; ``-E`` sets the job's)."""


class EntryPointNotFound(Exception):
    """The entry point names no script, module or command this job can run."""


def search_path(venv: Path, env: Mapping[str, str] | None = None) -> str:
    """The job's PATH: the venv's ``bin`` first, then the given (or the agent's) PATH."""
    base = (env or {}).get("PATH") or os.environ.get("PATH") or os.defpath
    return f"{venv / 'bin'}{os.pathsep}{base}"


def resolve_entry_point(
    entry_point: Sequence[str],
    repo: Path,
    venv: Path,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The command line for an entry point, run from the repository root.

    ``train.py args`` runs the repository's script with the venv's python, ``-m module args``
    runs a module, anything else is an executable: the repository's file if there is one,
    else a command on the job's PATH (the venv's ``bin`` first).
    """
    if not entry_point:
        raise EntryPointNotFound("the job has no entry point; give one after `--`")
    first, args = entry_point[0], list(entry_point[1:])
    python = str(venv / "bin" / "python")
    if first == "-m":
        if not args:
            raise EntryPointNotFound("`-m` needs a module name, e.g. `-m mypackage.train`")
        return [python, "-m", *args]
    in_repo = _inside(repo, first)
    if first.endswith(".py"):
        if in_repo is None or not in_repo.is_file():
            raise EntryPointNotFound(
                f"entry point '{first}' is not a file of the repository; give its path "
                "relative to the repository root"
            )
        return [python, str(in_repo), *args]
    if in_repo is not None and in_repo.is_file():
        if not os.access(in_repo, os.X_OK):
            raise EntryPointNotFound(
                f"entry point '{first}' is not executable; commit it with the executable bit "
                "(git update-index --chmod=+x) or run it through its interpreter"
            )
        return [str(in_repo), *args]
    if "/" in first and not first.startswith("/"):  # which() would look from the agent's cwd
        raise EntryPointNotFound(
            f"entry point '{first}' is not a file of the repository; give a path inside it, "
            "relative to its root, an absolute path, or a command on the node's PATH"
        )
    found = shutil.which(first, path=search_path(venv, env))
    if found is None:
        raise EntryPointNotFound(
            f"entry point '{first}' is neither a file of the repository nor a command on the "
            "node's PATH; add it to the repository or to its requirements"
        )
    return [found, *args]


@dataclass(frozen=True)
class Placement:
    """Where this node's part of a job sits among the job's nodes (torchrun's variables)."""

    node_index: int
    nnodes: int
    accels: int
    """Accelerators per node."""
    master_addr: str
    master_port: int


def job_environment(
    dirs: JobDirs,
    spec_env: Mapping[str, str],
    accelerators: Sequence[int],
    placement: Placement,
    base: Mapping[str, str] | None = None,
    restart_count: int = 0,
) -> dict[str, str]:
    """The entry point's environment: the node's, the user's ``--env``, then the platform's;
    ``restart_count``: the attempts of the job before this one (preempted or retried), which
    find their last checkpoint at ``FLEXAI_INPUT_CHECKPOINT_DIR``."""
    source = os.environ if base is None else base
    env = without_agent_settings(source)
    env.update(spec_env)
    env.update(
        {
            "FLEXAI_OUTPUT_DIR": str(dirs.output),
            "FLEXAI_OUTPUT_CHECKPOINT_DIR": str(dirs.output_checkpoint),
            "FLEXAI_INPUT_CHECKPOINT_DIR": str(dirs.input_checkpoint),
            "FLEXAI_INPUT_DIR": str(dirs.input),
            "FLEXAI_RESTART_COUNT": str(restart_count),
            "CUDA_VISIBLE_DEVICES": visible_devices(accelerators, source),
            "PYTHONUNBUFFERED": "1",
            "VIRTUAL_ENV": str(dirs.venv),
            "PATH": search_path(dirs.venv, env),
            **placement_variables(placement),
            **home_of(dirs),
            **marker_of(dirs),
        }
    )
    return env


def placement_variables(placement: Placement) -> dict[str, str]:
    """torchrun's rendezvous variables, so ``torchrun --nnodes=$NNODES ...`` runs unchanged."""
    return {
        "FLEXAI_NODE_INDEX": str(placement.node_index),
        "NODE_RANK": str(placement.node_index),
        "NNODES": str(placement.nnodes),
        "LOCAL_WORLD_SIZE": str(placement.accels),
        "WORLD_SIZE": str(placement.nnodes * placement.accels),
        "MASTER_ADDR": placement.master_addr,
        "MASTER_PORT": str(placement.master_port),
    }


def build_environment(dirs: JobDirs, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the build steps that run the job's code (venv, pip)."""
    source = os.environ if base is None else base
    return {**without_agent_settings(source), **home_of(dirs), **marker_of(dirs)}


def marker_of(dirs: JobDirs) -> dict[str, str]:
    """The job's marker: every process that inherits it is the job's."""
    return {MARKER_VARIABLE: dirs.marker} if dirs.marker else {}


def without_agent_settings(source: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in source.items() if key not in _AGENT_ONLY}


def home_of(dirs: JobDirs) -> dict[str, str]:
    """A home in the job's directory: the job finds no config of the agent's user there
    (``~/.config/flexai/config.json`` holds a token)."""
    return {"HOME": str(dirs.home), "XDG_CONFIG_HOME": str(dirs.home / ".config")}


def visible_devices(accelerators: Sequence[int], agent_env: Mapping[str, str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the node's indices.

    An agent confined to some GPUs (its own ``CUDA_VISIBLE_DEVICES=2,3``) numbers them from 0;
    its index ``i`` is then the ``i``-th device it was given.
    """
    given = [part.strip() for part in agent_env.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    given = [part for part in given if part]
    if given and all(index < len(given) for index in accelerators):
        return ",".join(given[index] for index in accelerators)
    return ",".join(str(index) for index in accelerators)


def _inside(repo: Path, relative: str) -> Path | None:
    """``repo/relative`` if it stays inside the repository, else None."""
    root = repo.resolve()
    candidate = (root / relative).resolve()
    return candidate if candidate.is_relative_to(root) else None
