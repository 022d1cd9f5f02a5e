"""The rooms and what may import what, checked by reading the sources (never importing them).

The top-level packages stack as ``common`` < ``domain`` < ``projections`` < ``api``, with
``node_agent`` and ``cli`` beside ``api`` on ``common`` alone: none of ``cli``, ``api`` and
``node_agent`` imports another. The domain takes of ``common`` its wire contract alone (its
docstring says so), which imports nothing but the standard library. Inside them each package
says in its docstring what of ours it may import (``Imports: ...``) beside its own modules,
and no module of it imports more. No two modules of ours import each other, however indirectly."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("common", "domain", "projections", "api", "node_agent", "cli")
BELOW = {
    "common": set(),
    "domain": {"common"},
    "projections": {"common", "domain"},
    "api": {"common", "domain", "projections"},
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


def imports_of(source: str, known: set[str] | dict[str, Path] = MODULES) -> set[str]:
    """The modules of ours a source imports, anywhere in it (a name imported from a package
    is that module when it is one)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if f"{node.module}.{alias.name}" in known)  # fmt: skip
    return {name for name in found if name.split(".")[0] in TOPS}


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
              "def later():\n    import node_agent.client\n    from cli import main\n")
    assert imports_of(source, {"api.http.app", "cli.main"}) == {
        "api.http", "api.http.app", "node_agent.client", "cli", "cli.main"}  # fmt: skip
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert declared("api.debug") >= {"api.scheduling", "domain"}


ABOUT_400 = 420
LONGER = {
    "node_agent/supervisor.py": "one job's life on its node (build, the control plane's go, "
                                "run, end), read top to bottom as it happens",
}
"""The modules over about 400 lines, each with its one job."""


def test_no_module_outside_the_tests_is_over_about_400_lines_but_those_named() -> None:
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for path in [*sources(), *sorted((ROOT / "bench").glob("*.py")),
                          *sorted((ROOT / "examples").rglob("*.py"))]}  # fmt: skip
    assert {name for name, lines in sizes.items() if lines > ABOUT_400} == set(LONGER)
