"""House rule 1: the domain imports only the standard library, eventsourcing and the wire
contract (``common.contract``, of the standard library alone), and the model modules only
``eventsourcing.domain`` of it, the contract, the value bounds and one another (checked by
reading the source, not importing it)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = ROOT / "domain"
CONTRACT = "common.contract"
MODEL_MODULES = (
    "actors.py", "statuses.py", "errors.py", "ids.py", "events.py", "lifecycle.py",
    "job_state.py", "job_facts.py", "job.py", "job_name.py", "node.py", "datasets.py",
    "scheduling.py", "values.py", "specs.py", "sharing.py", "job_attempts.py", "policy.py",
    "failures.py",
)  # fmt: skip
"""The aggregates, their rules and the values' bounds."""
SERVICE_MODULES = (
    "__init__.py", "application.py", "allocation.py", "reports.py", "history.py", "topics.py",
    "transcodings.py", "submissions.py", "name_claims.py", "node_turns.py", "outcomes.py",
    "scheduler_commands.py",
)  # fmt: skip
"""The application service that is the only write path, and what it uses beside the model."""


def imported_modules(source: str) -> set[str]:
    """Every module a domain source imports, anywhere in it (``.x`` read as ``domain.x``)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            modules.add(f"domain.{module}".rstrip(".") if node.level else module)
    return modules


def is_standard_library(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names or module == "__future__"


def foreign_imports(path: Path, allowed: tuple[str, ...]) -> set[str]:
    """Imports that are neither standard library nor ``allowed`` (a module or its parts)."""
    return {
        module
        for module in imported_modules(path.read_text())
        if not is_standard_library(module)
        and not any(module == ok or module.startswith(f"{ok}.") for ok in allowed)
    }


@pytest.mark.parametrize("path", sorted(DOMAIN.glob("*.py")), ids=lambda path: path.name)
def test_the_domain_imports_only_the_standard_library_and_eventsourcing(path: Path) -> None:
    assert foreign_imports(path, allowed=("eventsourcing", "domain", CONTRACT)) == set()


@pytest.mark.parametrize("name", MODEL_MODULES)
def test_the_model_modules_import_only_eventsourcing_domain(name: str) -> None:
    model = tuple(f"domain.{module.removesuffix('.py')}" for module in MODEL_MODULES)
    allowed = ("eventsourcing.domain", CONTRACT, *model)
    assert foreign_imports(DOMAIN / name, allowed=allowed) == set()


def test_the_wire_contract_the_domain_imports_imports_only_the_standard_library() -> None:
    assert foreign_imports(ROOT / "common" / "contract.py", allowed=()) == set()


def test_the_check_sees_imports_inside_functions_and_relative_ones() -> None:
    source = (
        "import json\nfrom eventsourcing.application import Application\n"
        "def later():\n    import fastapi\n    from .application import TrainingJobs\n"
    )
    assert imported_modules(source) == {
        "json", "eventsourcing.application", "fastapi", "domain.application",
    }  # fmt: skip


def test_every_domain_module_is_a_model_module_or_said_to_serve_the_application() -> None:
    assert {path.name for path in DOMAIN.glob("*.py")} == {*MODEL_MODULES, *SERVICE_MODULES}
