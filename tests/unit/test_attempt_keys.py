"""A job's attempts are named in one place (:mod:`common.attempts`): the server's artifact keys,
the agent's files and the requests that name an attempt all come from it, the first attempt's
where every job's always were and a later one's beside them; no other module spells them."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from api.artifacts.followers import AttemptLog, attempt_over
from api.artifacts.store import output_key
from common.attempts import attempt_key, attempt_query, current_attempt, last_attempt
from node_agent.jobdirs import JobDirs

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "common" / "attempts.py"
SPELLINGS = ("/attempts/", ".attempt-")


class KeyedStore:
    """An artifact store that says which key each log read or size asked for."""

    def __init__(self) -> None:
        self.keys: list[tuple[str, int]] = []

    def read_log(self, job_id: str, offset: int, limit: int = 0, node_index: int = 0) -> bytes:
        self.keys.append((job_id, node_index))
        return b""

    def log_size(self, job_id: str, node_index: int = 0) -> int:
        self.keys.append((job_id, node_index))
        return 0


def test_the_first_attempts_artifacts_keep_the_jobs_own_keys_and_a_later_ones_its_number() -> None:
    assert attempt_key("job-1", 1) == "job-1"
    assert attempt_key("job-1", 3) == "job-1/attempts/3"
    assert output_key("job-1", 0) == output_key("job-1", 0, 1) == "jobs/job-1/outputs/output_0.zip"
    assert output_key("job-1", 2, 3) == "jobs/job-1/attempts/3/outputs/output_2.zip"
    store = KeyedStore()
    for attempt in (1, 2):
        log = AttemptLog(store, "job-1", node_index=1, attempt=attempt)  # type: ignore[arg-type]
        log.read(0)
        log.size()
    assert store.keys == [("job-1", 1)] * 2 + [("job-1/attempts/2", 1)] * 2


def test_the_agent_names_each_attempts_files_after_the_first_attempts(tmp_path: Path) -> None:
    first = JobDirs.for_job(tmp_path, "job-1")
    third = first.for_attempt(3)
    assert (first.log_file.name, third.log_file.name) == ("job.log", "job.attempt-3.log")
    assert (first.output.name, third.output.name) == ("output", "output.attempt-3")
    assert third.checkpoint_record.name == "checkpoints.attempt-3.json"
    assert first.checkpoint_record.name == "checkpoints.json"
    assert first.earlier_logs() == []
    assert [path.name for path in third.earlier_logs()] == ["job.log", "job.attempt-2.log"]
    assert all(third.is_log(path) for path in [*third.earlier_logs(), third.log_file])


def test_requests_name_a_later_attempt_and_leave_the_first_unnamed() -> None:
    assert attempt_query(1) == {}
    assert attempt_query(2) == {"attempt": 2}


@pytest.mark.parametrize(("document", "current", "last"), [
    ({"name": "old"}, 1, 1),  # folded before attempts existed
    ({"attempt": 2, "attempts": [{"attempt": 1}, {"attempt": 2}]}, 2, 2),
    ({"attempt": 1, "attempts": [{"attempt": 1}, {"attempt": 2}]}, 1, 2),
])  # fmt: skip
def test_a_jobs_current_and_last_attempt_read_from_its_view(
    document: dict[str, Any], current: int, last: int
) -> None:
    assert (current_attempt(document), last_attempt(document)) == (current, last)


def test_an_attempts_log_is_over_once_the_job_ended_or_runs_a_later_attempt() -> None:
    running = {"status": "in progress", "attempt": 2}
    assert not attempt_over(running, 2)
    assert attempt_over(running, 1)
    assert attempt_over({"status": "failed", "attempt": 2}, 2)
    assert attempt_over(None, 1)
    assert attempt_over({**running, "deleted_at": "2026-01-01T00:00:00+00:00"}, 2)


def _docstrings(tree: ast.AST) -> set[int]:
    """The strings that stand alone: modules', classes', functions' and attributes' docs."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}  # fmt: skip


def _compares_an_attempt_with_one(node: ast.AST) -> bool:
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    named = any((side.id if isinstance(side, ast.Name) else getattr(side, "attr", "")
                 ).endswith("attempt") for side in sides)  # fmt: skip
    return named and any(isinstance(side, ast.Constant) and side.value == 1 for side in sides)


def spelled_elsewhere(path: Path) -> list[str]:
    """Where a module's code (not its docstrings) builds an attempt's name or branches on the
    first attempt itself."""
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        spells = isinstance(node, ast.Constant) and isinstance(node.value, str) \
            and any(spelling in node.value for spelling in SPELLINGS)  # fmt: skip
        if spells and id(node) not in docstrings:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
        if _compares_an_attempt_with_one(node):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_but_common_attempts_spells_an_attempts_name_or_tells_the_first_apart() -> None:
    modules = [path for top in ("common", "domain", "projections", "api", "node_agent", "cli")
               for path in sorted((ROOT / top).rglob("*.py")) if path != OWNER]  # fmt: skip
    assert [line for path in modules for line in spelled_elsewhere(path)] == []
    assert spelled_elsewhere(OWNER)  # the check sees what it must
