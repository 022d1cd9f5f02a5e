"""The lifecycle table of ``domain/lifecycle.py`` is the one docs/design.md shows, allows the
transitions SPEC.md allows today and nothing else, and has a row for every event of a job."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from eventsourcing.domain import Aggregate

from domain.actors import agent, scheduler, user
from domain.errors import DomainError
from domain.job import TrainingJob
from domain.job_attempts import JobAttempts
from domain.lifecycle import LIFECYCLE, ROWS, TRANSITIONS, markdown_table
from domain.statuses import Status
from tests.support import SPEC_TRANSITIONS

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
SPEC = ROOT.parent / "shared" / "SPEC.md"
"""The product specification, kept beside the repository rather than in it."""

Pair = tuple[str, str]


def model_transitions() -> set[Pair]:
    return {(str(source), str(target)) for source, targets in TRANSITIONS.items()
            for target in targets}  # fmt: skip


def spec_rows(text: str) -> list[list[Pair]]:
    """SPEC.md's "Allowed transitions" table: each row's (from, to) pairs, in its order."""
    _, _, after = text.partition("Allowed transitions")
    table = [line for line in after.split("\n\n")[1].splitlines() if line.startswith("|")]
    rows = []
    for line in table[2:]:  # the header and the separator
        sources, target = (cell.strip() for cell in line.strip("|").split("|")[:2])
        rows.append([(source, target) for source in re.split(r",\s*", sources)])
    return rows


def test_the_design_doc_shows_the_table_as_the_code_prints_it() -> None:
    printed = markdown_table()
    assert printed.count("\n") == len(LIFECYCLE) + 2
    assert printed in DESIGN.read_text(), (
        "docs/design.md's lifecycle table differs from the code: paste "
        "`python -c 'from domain.lifecycle import markdown_table; print(markdown_table())'`"
    )


def test_the_table_allows_exactly_the_transitions_of_the_spec() -> None:
    assert model_transitions() == SPEC_TRANSITIONS


def test_the_table_agrees_with_the_transitions_spec_md_allows_today() -> None:
    if not SPEC.exists():
        pytest.skip(f"{SPEC} is not beside this checkout")
    rows = spec_rows(SPEC.read_text())
    assert len(rows) == 16 and ("building", "scheduling") in rows[-1]
    assert {pair for row in rows for pair in row} == SPEC_TRANSITIONS == model_transitions()


def test_every_event_of_a_job_has_one_row() -> None:
    events = {name for cls in (TrainingJob, JobAttempts) for name, value in vars(cls).items()
              if isinstance(value, type) and issubclass(value, Aggregate.Event)}  # fmt: skip
    events -= {"Event", "Created"}  # the base classes eventsourcing defines on every aggregate
    assert set(ROWS) == events
    assert len(ROWS) == len(LIFECYCLE)


def test_every_row_says_how_a_job_in_another_status_is_refused() -> None:
    for row in LIFECYCLE:
        for status in set(Status) - row.sources:
            refusal = row.refuse("my-job", status)
            assert f"job 'my-job' is '{status}'" in str(refusal), row.event


def test_a_job_does_not_start_before_every_node_of_it_is_built() -> None:
    spec = {"repository_url": "https://example.com/r.git", "entry_point": ["train.py"],
            "accels": 1, "nodes": 2}  # fmt: skip
    job = TrainingJob.submit(owner="alice", name="two-nodes", spec=spec, by=user("alice"))
    job.begin_scheduling(by=scheduler())
    nodes = [{"node_id": f"node-{i}", "node_name": f"gpu-{i}", "address": None} for i in (0, 1)]
    job.assign("node-0", "gpu-0", by=scheduler(), nodes=nodes)
    job.record_built(0, "c0ffee", None, by=agent("gpu-0"))
    job.collect_events()
    with pytest.raises(DomainError, match="'two-nodes' cannot start before every node is built"):
        job.start("c0ffee", [0], by=scheduler(), allocations=[[0], [0]])
    assert job.collect_events() == []
    job.record_built(1, "c0ffee", None, by=agent("gpu-1"))
    job.start("c0ffee", [0], by=scheduler(), allocations=[[0], [0]])
    assert job.status == "in progress"


def test_only_a_deleted_job_records_that_its_artifacts_were_purged_and_only_once() -> None:
    spec = {"repository_url": "https://example.com/r.git", "entry_point": ["train.py"],
            "accels": 1, "nodes": 1}  # fmt: skip
    job = TrainingJob.submit(owner="alice", name="old", spec=spec, by=user("alice"))
    job.begin_scheduling(by=scheduler())
    job.reject("no_node_available", "no node", by=scheduler())
    with pytest.raises(DomainError, match="'old' keeps its artifacts until it is deleted"):
        job.purge_artifacts(3, by=user("admin"))
    job.delete(by=user("alice"))
    job.collect_events()

    assert job.purge_artifacts(3, by=user("admin")) is True
    assert job.purge_artifacts(0, by=user("admin")) is False
    [purged] = job.collect_events()
    assert (type(purged).__name__, purged.objects) == ("ArtifactsPurged", 3)
    with pytest.raises(DomainError, match="deleted"):
        job.request_stop(by=user("alice"))  # nothing else is recorded on a deleted job
