"""The API's path templates (``/v1/jobs/{name}``) and the methods of each, for answers given
where the router has not run or names too little: a 401 or 413 of the body limits (the route
label of its metrics), a 405 (its ``Allow`` header)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


class RouteTemplates:
    """Built from the routers the app includes as they are (no prefix added there)."""

    def __init__(self, routers: Iterable[Any]) -> None:
        self._templates: list[tuple[re.Pattern[str], str, frozenset[str]]] = [
            (route.path_regex, route.path, frozenset(route.methods))
            for router in routers for route in router.routes
            if getattr(route, "path_regex", None) is not None and getattr(route, "methods", None)
        ]  # fmt: skip

    def template(self, method: str, path: str) -> str | None:
        """The template ``path`` matches, one with ``method`` first; None if none."""
        matching = [(method in methods, template) for pattern, template, methods
                    in self._templates if pattern.match(path)]  # fmt: skip
        return max(matching, key=lambda found: found[0])[1] if matching else None

    def methods(self, path: str) -> list[str]:
        """Every method of every template ``path`` matches (HEAD with GET, as served)."""
        found = {method for pattern, _, methods in self._templates if pattern.match(path)
                 for method in methods}  # fmt: skip
        if "GET" in found:
            found.add("HEAD")
        return sorted(found)
