"""The rooms and what may import what, checked by reading the sources (never importing them).

The top-level packages stack as ``common`` < ``domain`` < ``projections`` < ``api``, with the
``ledger`` (where events are stored) under ``projections`` and ``api`` beside ``domain``, and
``node_agent`` and ``cli`` beside ``api`` on ``common`` alone: none of ``cli``, ``api`` and
``node_agent`` imports another. The domain takes of ``common`` its wire contract and the job
spec alone (its docstring says so), which import nothing but the standard library (the spec,
the contract's limits): the one typed spec goes from the API's body through the ledger to the
agent, so the domain holds the very type the agent parses. Inside them each package
says in its docstring what of ours it may import (``Imports: ...``) beside its own modules,
and no module of it imports more. No two modules of ours import each other, however indirectly.

House rule 1: the domain imports only the standard library, eventsourcing, the wire contract
and the job spec (``common.contract``, ``common.job_spec``, of the standard library alone), and
the model modules only ``eventsourcing.domain`` of it, those two, the value bounds and one
another. The client
(``cli`` and ``common``) imports no package but those ``pip install flexai-control-plane``
brings, the server's and the agent's being extras."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("common", "domain", "ledger", "projections", "api", "node_agent", "cli")
BELOW = {
    "common": set(),
    "domain": {"common"},
    "ledger": set(),
    "projections": {"common", "domain", "ledger"},
    "api": {"common", "domain", "ledger", "projections"},
    "node_agent": {"common"},
    "cli": {"common"},
}
"""What of ours each top-level package may import at most, besides itself."""
OURS = re.compile(rf"\b(?:{'|'.join(TOPS)})(?:\.[a-z_]+)*\b")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> Iterator[Path]:
    for top in TOPS:
        yield from sorted((ROOT / top).rglob("*.py"))


MODULES = {module_name(path): path for path in sources()}
PACKAGES = sorted(name for name, path in MODULES.items() if path.name == "__init__.py")


def imported(source: str, known: set[str] | dict[str, Path] = MODULES) -> set[str]:
    """Every module a source imports, anywhere in it (a name imported from a package is that
    module when it is one of ``known``; a relative import keeps its dots, and so is nobody's)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names
                         if f"{module}.{alias.name}" in known)  # fmt: skip
    return found


def imports_of(source: str, known: set[str] | dict[str, Path] = MODULES) -> set[str]:
    """The modules of ours a source imports, anywhere in it."""
    return {name for name in imported(source, known) if name.split(".")[0] in TOPS}


def declared(package: str) -> set[str]:
    """What the package's docstring says it may import (``Imports: a, b (why), c.``)."""
    docstring = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    _, said, rest = docstring.partition("Imports:")
    assert said, f"{package}/__init__.py: its docstring says nothing of what it may import"
    return set(OURS.findall(re.sub(r"\([^)]*\)", "", rest)))


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def package_of(module: str) -> str:
    if MODULES[module].name == "__init__.py":
        return module
    return module.rpartition(".")[0]


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_what_its_docstring_declares(package: str) -> None:
    allowed = declared(package)
    outside = {
        f"{module} imports {name}"
        for module, path in MODULES.items()
        if package_of(module) == package
        for name in imports_of(path.read_text())
        if not within(name, package) and not any(within(name, ok) for ok in allowed)
    }
    assert outside == set()


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_declares_an_import_that_goes_up_a_layer_or_across(package: str) -> None:
    top = package.split(".")[0]
    wrong = {name for name in declared(package)
             if name.split(".")[0] != top and name.split(".")[0] not in BELOW[top]}  # fmt: skip
    assert wrong == set()


@pytest.mark.parametrize("top", ["cli", "api", "node_agent"])
def test_cli_api_and_node_agent_never_import_one_another(top: str) -> None:
    others = {"cli", "api", "node_agent"} - {top}
    crossing = {f"{module} imports {name}"
                for module, path in MODULES.items() if within(module, top)
                for name in imports_of(path.read_text()) if name.split(".")[0] in others}
    assert crossing == set()


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (its strongly connected parts of two modules or more)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for after in graph[node]:
            if after not in order:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], order[after])
        if low[node] == order[node]:
            part = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(part) > 1:
                found.append(sorted(part))

    for node in graph:
        if node not in order:
            visit(node)
    return found


def test_no_two_modules_import_each_other_even_through_others() -> None:
    graph = {module: {name for name in imports_of(path.read_text()) if name in MODULES} - {module}
             for module, path in MODULES.items()}  # fmt: skip
    assert cycles(graph) == []


def test_the_checks_see_what_they_must() -> None:
    source = ("import json\nfrom api.http import app\n"
              "def later():\n    import node_agent.client\n    from cli import main\n"
              "    from .application import TrainingJobs\n")
    assert imports_of(source, {"api.http.app", "cli.main"}) == {
        "api.http", "api.http.app", "node_agent.client", "cli", "cli.main"}  # fmt: skip
    assert imported(source) - imports_of(source) == {"json", ".application"}
    assert foreign(source, allowed=("api", "cli")) == {"node_agent.client", ".application"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert declared("api.debug") >= {"api.scheduling", "domain"}


# --- house rule 1: the domain -----------------------------------------------------------------

MODEL_MODULES = (
    "actors", "statuses", "errors", "ids", "events", "lifecycle", "job_state", "job_facts", "job",
    "job_name", "node", "datasets", "scheduling", "values", "specs", "sharing", "job_attempts",
    "job_records", "policy", "failures",
)  # fmt: skip
"""The aggregates, their rules and the values' bounds."""
CONTRACT = "common.contract"
JOB_SPEC = "common.job_spec"
"""What the domain takes of ``common``: the wire contract and a job's spec (the one typed value
the API, the ledger and the agent share), of the standard library alone."""
SERVICE_MODULES = (
    "application", "allocation", "reports", "history", "topics", "transcodings", "submissions",
    "name_claims", "node_turns", "outcomes", "scheduler_commands",
)  # fmt: skip
"""The application service that is the only write path, and what it uses beside the model."""


def is_standard_library(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names or module == "__future__"


def foreign(source: str, allowed: tuple[str, ...]) -> set[str]:
    """What a source imports that is neither standard library nor ``allowed`` (or its parts)."""
    return {name for name in imported(source) if not is_standard_library(name)
            and not any(within(name, ok) for ok in allowed)}  # fmt: skip


@pytest.mark.parametrize("module", [name for name in MODULES if within(name, "domain")])
def test_the_domain_imports_only_the_standard_library_and_eventsourcing(module: str) -> None:
    assert foreign(MODULES[module].read_text(),
                   allowed=("eventsourcing", "domain", CONTRACT, JOB_SPEC)) == set()  # fmt: skip


@pytest.mark.parametrize("name", MODEL_MODULES)
def test_the_model_modules_import_only_eventsourcing_domain(name: str) -> None:
    model = tuple(f"domain.{module}" for module in MODEL_MODULES)
    source = MODULES[f"domain.{name}"].read_text()
    assert foreign(source, allowed=("eventsourcing.domain", CONTRACT, JOB_SPEC, *model)) == set()


def test_the_wire_contract_the_domain_imports_imports_only_the_standard_library() -> None:
    assert foreign(MODULES[CONTRACT].read_text(), allowed=()) == set()


def test_the_job_spec_the_domain_imports_imports_only_the_standard_library_and_contract() -> None:
    assert foreign(MODULES[JOB_SPEC].read_text(), allowed=(CONTRACT,)) == set()


def test_every_domain_module_is_a_model_module_or_said_to_serve_the_application() -> None:
    assert {name for name in MODULES if within(name, "domain")} == {
        "domain", *(f"domain.{name}" for name in (*MODEL_MODULES, *SERVICE_MODULES))}  # fmt: skip


# --- what each install brings -----------------------------------------------------------------

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = {"cli": (), "common": (), "domain": ("server",), "ledger": ("server",),
          "projections": ("server",),
          "api": ("server",), "node_agent": ("agent",)}  # fmt: skip
"""The extras whose packages a top-level package may import beside the plain install's."""


def distribution(requirement: str) -> str:
    """A requirement's distribution, normalized: ``psycopg[binary]>=3.1`` -> ``psycopg``."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def brought(*extras: str) -> set[str]:
    """The distributions ``pip install flexai-control-plane[extras]`` asks for by name."""
    requirements = [*PROJECT["dependencies"],
                    *(r for extra in extras for r in PROJECT["optional-dependencies"][extra])]
    return {distribution(requirement) for requirement in requirements}  # fmt: skip


def third_party(top: str) -> dict[str, set[str]]:
    """What a top-level package's modules import beyond the standard library and ours, by
    top-level name: the installed distributions that provide it."""
    names = {name.split(".")[0] for module, path in MODULES.items() if within(module, top)
             for name in foreign(path.read_text(), allowed=TOPS)}  # fmt: skip
    provided = metadata.packages_distributions()
    return {name: {distribution(d) for d in provided.get(name, [])} for name in names}


@pytest.mark.parametrize("top", TOPS)
def test_each_package_imports_only_what_its_install_brings(top: str) -> None:
    allowed = brought(*EXTRAS[top])
    assert {name for name, dists in third_party(top).items() if not dists & allowed} == set()


def test_the_plain_install_brings_only_what_the_client_imports() -> None:
    used = {dist for top in ("cli", "common") for dists in third_party(top).values()
            for dist in dists}  # fmt: skip
    assert brought() <= used


ABOUT_400 = 420
LONGER: dict[str, str] = {}
"""The modules over about 400 lines, each with its one job."""


def test_no_module_outside_the_tests_is_over_about_400_lines_but_those_named() -> None:
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for path in [*sources(), *sorted((ROOT / "bench").glob("*.py")),
                          *sorted((ROOT / "examples").rglob("*.py"))]}  # fmt: skip
    assert {name for name, lines in sizes.items() if lines > ABOUT_400} == set(LONGER)
