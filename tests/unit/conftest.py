"""Fixtures of the agent's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from node_agent.run.jobrun import JobRun


@pytest.fixture
def job_runs() -> Iterator[list[JobRun]]:
    """Entry points a test starts through the shim: ended afterwards, even when it fails."""
    runs: list[JobRun] = []
    yield runs
    for run in runs:
        run.end(grace=0)
