"""The wire contract has one home: no header name, name rule (its pattern or its wording) or
multi-word status is spelled in code outside ``common/contract.py`` (checked by reading the
sources; docstrings and other bare strings that document may name them), so that the CLI, the
server and the agent can never drift apart again."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from common import contract

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "common" / "contract.py"
TOPS = ("common", "domain", "projections", "api", "node_agent", "cli", "bench", "examples")
SPELLINGS = (
    "x-flexai-",
    contract.JOB_NAME.pattern, "[A-Za-z0-9_-]{1,61}", "[A-Za-z0-9_-]{0,62}",
    contract.DATASET_NAME.pattern, contract.SECRET_NAME.pattern, "[A-Za-z_][A-Za-z0-9_]",
    contract.JOB_NAME_RULE, contract.DATASET_RULE, contract.SECRET_RULE,
    "may hold only letters, digits", "start and end with a letter",
    "is not an environment variable name", "which git reads as an option",
)  # fmt: skip
"""What only the contract spells, in any string of code (compared without regard to case)."""
STATUSES = {contract.Status.IN_PROGRESS, contract.Status.STOP_IN_PROGRESS,
            contract.Status.STOP_FAILED}  # fmt: skip
"""Statuses no other word is spelled as: a string that is one of them is a copy (a sentence
that names one, in a message, is not)."""


def sources() -> Iterator[Path]:
    for top in TOPS:
        yield from (path for path in sorted((ROOT / top).rglob("*.py")) if path != HOME)


def spelled(source: str) -> set[str]:
    """The contract's spellings among the strings of a source's code (not its bare strings)."""
    tree = ast.parse(source)
    bare = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}  # fmt: skip
    texts = [node.value.lower() for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and id(node) not in bare]  # fmt: skip
    return {spelling for spelling in SPELLINGS if any(spelling.lower() in text for text in texts)
            } | {str(status) for status in STATUSES if status in texts}  # fmt: skip


@pytest.mark.parametrize("path", list(sources()), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_header_name_rule_or_status_is_spelled_outside_the_contract(path: Path) -> None:
    assert spelled(path.read_text()) == set()


def test_the_scan_sees_a_copy_in_code_but_not_in_what_documents_it() -> None:
    source = (
        '"""Sends ``X-Flexai-Attempt``."""\n'
        'HEADER = "X-Flexai-Attempt"\n'
        'NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{1,61}[A-Za-z0-9]$")\n'
        'def f(status):\n    """Unless ``stop failed``."""\n    return status == "stop failed"\n'
        'SAID = "wait until it is \'in progress\'"\n'
    )
    assert spelled(source) == {
        "x-flexai-", contract.JOB_NAME.pattern, "[A-Za-z0-9_-]{1,61}", "stop failed"}


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("ab", "is 2 characters long; use 3 to 63"),
        ("a", "is 1 character long; use 3 to 63"),
        ("job.v2", "may hold only letters, digits, '-' and '_'"),
        ("job_", "must start and end with a letter or a digit"),
    ],
)
def test_a_job_name_is_refused_in_one_wording_that_says_what_is_wrong(
    name: str, problem: str
) -> None:
    with pytest.raises(contract.Refusal) as refused:
        contract.check_job_name(name)
    assert str(refused.value) == f"{name!r} {problem}"


@pytest.mark.parametrize("stem", ["s", "run_", "lr-", "a" * 63])
def test_a_sweeps_stem_may_be_short_and_end_with_a_dash_or_underscore(stem: str) -> None:
    assert contract.check_job_name(stem, stem=True) == stem
    with pytest.raises(contract.Refusal, match="must start with a letter or a digit"):
        contract.check_job_name(f"-{stem[1:]}", stem=True)
