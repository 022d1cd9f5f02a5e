"""The web console in-process for the integration tests: the real app on the real store, and
one browser-like client per person (each its own cookies), signed in with its API token."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.services import Services, build_services
from api.settings import Settings

ORIGIN = "http://testserver"
SPEC = {"repository_url": "/nowhere", "entry_point": ["train.py"]}
CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@dataclass
class Person:
    name: str
    token: str
    client: TestClient

    @property
    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def sign_in(self, token: str | None = None) -> Any:
        return self.client.post("/sign-in", data={"token": token or self.token, "next": "/"},
                                headers={"Origin": ORIGIN}, follow_redirects=False)  # fmt: skip

    def csrf(self, path: str = "/") -> str:
        page = self.client.get(path)
        found = CSRF.search(page.text)
        assert found is not None, page.text[:2000]
        return found.group(1)

    def post(self, path: str, fields: dict[str, str], origin: str | None = ORIGIN,
             **headers: str) -> Any:  # fmt: skip
        sent = {"Origin": origin} if origin else {}
        return self.client.post(path, data=fields, headers={**sent, **headers},
                                follow_redirects=False)  # fmt: skip

    def submit(self, name: str, **spec: Any) -> dict[str, Any]:
        """A job of this person's, through the API with the token."""
        answer = self.client.post("/v1/jobs", headers=self.bearer,
                                  json={**SPEC, "name": name, **spec})  # fmt: skip
        assert answer.status_code == 201, answer.text
        document: dict[str, Any] = answer.json()
        return document


class Site:
    def __init__(self, services: Services, app: FastAPI) -> None:
        self.services = services
        self.app = app

    def person(self, name: str, *, admin: bool = False, signed_in: bool = True) -> Person:
        issued = self.services.identities.create_user(name, admin=admin, by="admin")
        person = Person(name, issued.token, TestClient(self.app))
        if signed_in:
            answer = person.sign_in()
            assert answer.status_code == 303, answer.text
        return person


@contextmanager
def console_site(database_url: str, data_dir: Path) -> Iterator[Site]:
    services = build_services(Settings(data_dir=data_dir, database_url=database_url))
    app = create_app(services, background=False)
    try:
        with TestClient(app):  # the app's start: views caught up
            yield Site(services, app)
    finally:
        services.close()


def server_events(lines: Iterator[str], until: str) -> list[tuple[str, str]]:
    """The (event, data) pairs of a server-sent event stream, up to and with ``until``."""
    events: list[tuple[str, str]] = []
    kind, data = "message", ""
    for line in lines:
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
        elif line == "" and data:
            events.append((kind, data))
            if kind == until:
                return events
            kind, data = "message", ""
    return events
