"""A later attempt of a job built on this node, after a preemption (:mod:`node_agent.preemption`
decides when): it keeps the build (the repository, the venv, the inputs) and gets folders of its
own (its log, output and checkpoint folders: see :class:`node_agent.jobdirs.JobDirs`), with the
checkpoint the control plane names unpacked into its fresh input checkpoint folder, as the build
does for the first attempt.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from node_agent.build.builder import BuildFailed, FetchCheckpoint, JobBuild
from node_agent.build.secrets import JobSecrets
from node_agent.jobdirs import JobDirs
from node_agent.models import Assignment
from node_agent.run.jobuser import JobUser, hand_over_folders
from node_agent.run.launch import EntryPointNotFound, resolve_entry_point


def prepare_attempt(
    dirs: JobDirs,
    assignment: Assignment,
    *,
    secrets: JobSecrets,
    fetch_checkpoint: FetchCheckpoint,
    log: Callable[[str], None],
    cancel: threading.Event,
    as_user: JobUser | None,
    python: str = sys.executable,
) -> tuple[str, ...]:
    """Make ``dirs`` (the new attempt's, made by :meth:`JobDirs.create_attempt`) ready: the
    input checkpoint the assignment names fetched and unpacked, the folders handed to the
    job's user; return the entry point's command line. :class:`BuildFailed` says why the
    attempt cannot run here."""
    build = JobBuild(
        assignment.spec,
        dirs,
        log=log,
        cancel=cancel,
        input_checkpoint_id=assignment.input_checkpoint_id,
        fetch_checkpoint=fetch_checkpoint,
        as_user=as_user,
        python=python,
        secrets=secrets,
    )
    build.require_secrets()
    build.unpack_input_checkpoint()
    if as_user is not None:
        hand_over_folders(dirs.attempt_folders, as_user)
    try:
        argv = resolve_entry_point(assignment.spec.entry_point, dirs.repo, dirs.venv,
                                   assignment.spec.env)  # fmt: skip
    except EntryPointNotFound as error:  # its build is gone from this node
        raise BuildFailed("entry_point_not_found", str(error), None) from None
    return tuple(argv)
