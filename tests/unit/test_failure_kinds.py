"""Every failure code the agent and the scheduler send is classified (``domain.failures``):
the infrastructure's or the user's, never both, and the infrastructure's are retried."""

from __future__ import annotations

import ast
from pathlib import Path

from common.job_spec import JobSpec
from domain.failures import INFRASTRUCTURE_FAILURES, USER_FAILURES, FailureKind, failure_kind
from domain.sharing import retry_cause

ROOT = Path(__file__).resolve().parents[2]
FAILING = {"Failure", "BuildFailed", "DatasetUnavailable", "Reject", "failed", "build_failed",
           "fail", "fail_build", "retry_if_owed"}  # fmt: skip
"""The calls that carry a failure's code, first or as ``code=``."""


def sent_codes() -> dict[str, str]:
    """Each failure code written in the agent, the server and the domain, and where."""
    found: dict[str, str] = {}
    for top in ("node_agent", "api", "domain"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                    getattr(node.func, "id", "")  # fmt: skip
                if name not in FAILING:
                    continue
                given = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "code")]
                for value in given:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        found[value.value] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def test_every_code_sent_is_classified_once() -> None:
    codes = sent_codes()
    assert {"node_lost", "secret_unavailable", "revision_not_found", "no_node_available",
            "time_limit_exceeded"} <= codes.keys()  # the scan sees what it must  # fmt: skip
    unclassified = {code: where for code, where in codes.items()
                    if code not in INFRASTRUCTURE_FAILURES | USER_FAILURES}  # fmt: skip
    assert unclassified == {}
    assert INFRASTRUCTURE_FAILURES.isdisjoint(USER_FAILURES)


def test_the_infrastructures_failures_are_retried_and_the_users_only_on_their_exit_codes() -> None:
    spec = JobSpec.from_dict({"max_retries": 2, "retry_on_exit_codes": [137, 143]})
    for code in INFRASTRUCTURE_FAILURES:
        assert retry_cause(spec, code, None) == code
        assert failure_kind(code) is FailureKind.INFRASTRUCTURE
    for code in USER_FAILURES - {"entry_point_failed"}:
        assert retry_cause(spec, code, 143) is None  # a time limit's SIGTERM included
        assert failure_kind(code) is FailureKind.USER
    assert retry_cause(spec, "entry_point_failed", 137) == "exit code 137"
    assert retry_cause(spec, "entry_point_failed", 1) is None
    assert failure_kind("a_code_from_a_newer_agent") is FailureKind.USER  # never loops
