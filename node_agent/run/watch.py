"""Watching a job's entry point until it ends by itself, is stopped, or runs past its time limit;
and how it ended, in the words the job's log and the reports use."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.durations import human_duration
from node_agent.run.jobrun import JobRun
from node_agent.run.processes import exit_code

Say = Callable[[str], None]


@dataclass(frozen=True)
class Ended:
    """How the entry point's processes ended."""

    exit_code: int | None
    """The entry point's (``128 + N`` when killed by signal N); None when not known."""
    survivors: list[int]
    """The pids of the job still alive after SIGKILL."""
    stopped: bool = False
    """Ended by the user's stop rather than by itself."""
    timed_out: bool = False
    """Ended by the agent because it ran past its time limit."""
    lost: str | None = None
    """Why nothing is known of how it ended (the job is lost), if so."""


def watch(
    run: JobRun,
    *,
    stopping: threading.Event,
    grace: Callable[[], float],
    time_limit_s: int | None,
    say: Say,
) -> Ended:
    """Wait for the entry point to end, ending it (and every process of the job) on a stop or
    past its time limit; processes it leaves behind when it ends by itself go with it."""
    deadline = None if time_limit_s is None else run.started + time_limit_s
    while not run.wait(0.2):
        if stopping.is_set():
            seconds = grace()
            say(f"[agent] stopping: SIGTERM to the job's processes, SIGKILL after {seconds:g} s")
            return ended(run, run.end(seconds), say, stopped=True)
        if deadline is not None and time.time() >= deadline:
            assert time_limit_s is not None
            seconds = grace()
            say(
                f"[agent] the job ran past its time limit of {human_duration(time_limit_s)}: "
                f"SIGTERM to the job's processes, SIGKILL after {seconds:g} s"
            )
            return ended(run, run.end(seconds), say, timed_out=True)
    return ended(run, run.end(grace()), say)


def ended(
    run: JobRun, survivors: list[int], say: Say, stopped: bool = False, timed_out: bool = False
) -> Ended:
    """What the shim recorded of the entry point's end, said in the job's log."""
    code = run.returncode()
    if code is None:
        lost = "the job's processes ended without leaving an exit code (its shim was killed)"
        say(f"[agent] {lost}")
        return Ended(None, survivors, stopped, timed_out, lost)
    if code < 0:
        say(f"[agent] the entry point was killed by {_signal_name(-code)} "
            f"(exit code {exit_code(code)})")  # fmt: skip
    else:
        say(f"[agent] the entry point exited with code {code}")
    return Ended(exit_code(code), survivors, stopped, timed_out)


def time_limit_message(time_limit_s: int) -> str:
    return f"the job ran past its time limit of {human_duration(time_limit_s)}; it was ended"


def stop_outcome(survivors: list[int]) -> str:
    if not survivors:
        return "stopped"
    return (
        f"processes {', '.join(map(str, survivors))} of the job are still alive after SIGKILL "
        "(stuck in the kernel, e.g. on a hung GPU or file system); the node's operator must "
        "end them"
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
