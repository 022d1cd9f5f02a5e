"""The one client class of the CLI: a method per route of the control plane's "Users" API
(jobs, debug sessions, datasets, secrets, users and tokens, the audit ledger), on the HTTP
mechanics of :mod:`cli.client.http`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from cli.client.http import HttpSession
from cli.errors import CliError
from common.attempts import current_attempt
from common.client_config import load_client_config
from common.contract import ATTEMPT_HEADER, TERMINAL
from common.tls import client_context
from common.transfer import Altered, Fetched, Refused, Unavailable, fetch

FETCH_PATIENCE_S = 10.0
"""How long `fetch` keeps trying while the store or the control plane is away (or after a
cut without progress) before it says so."""


def _of(attempt: int | None) -> str:
    """The query that names an attempt (none: the server's default)."""
    return "" if attempt is None else f"?attempt={int(attempt)}"


def _segment(value: str | int) -> str:
    """One URL path segment, so that a name can never reach another route."""
    return quote(str(value), safe="")


class ApiClient(HttpSession):
    """Talks to the control plane's ``/v1`` "Users" routes with a bearer token."""

    @classmethod
    def from_config(cls, owner: str | None = None) -> ApiClient:
        """A client for the URL and token of ``common.client_config`` (env vars, then the
        file); with ``owner``, acting on that user's jobs (admins)."""
        config = load_client_config()
        return cls(config.api_url, config.token, owner=owner, ca_file=config.ca_file)

    # --- jobs ----------------------------------------------------------------------------

    def create_job(self, job: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/jobs``: submit a JobCreate, get the JobPublic."""
        return self._json("POST", "/v1/jobs", json=job)

    def create_jobs(self, jobs: list[dict[str, Any]]) -> dict[str, Any]:
        """``POST /v1/jobs`` with a list of JobCreate (at most 1,000): ``{"results": [...],
        "created": n, "failed": m}``, a result per job in order: ``{"status": 201, "job":
        JobPublic}``, or its status and ``problem`` (that job alone was refused)."""
        return self._json("POST", "/v1/jobs", json=jobs)

    def list_jobs(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        statuses: Iterable[str] = (),
        name_prefix: str | None = None,
    ) -> dict[str, Any]:
        """``GET /v1/jobs``: one page, ``{"jobs": [JobSummary], "count": n, "next_cursor":
        str | None}``, newest first; pass ``next_cursor`` back as ``cursor`` for the next."""
        params: dict[str, Any] = {"status": list(statuses)}
        if limit is not None:
            params["limit"] = limit
        if cursor:
            params["cursor"] = cursor
        if name_prefix:
            params["name_prefix"] = name_prefix
        return self._json("GET", "/v1/jobs", params=params)

    def get_job(self, name: str) -> dict[str, Any]:
        """``GET /v1/jobs/{name}``: the JobPublic."""
        return self._json("GET", f"/v1/jobs/{_segment(name)}")

    def stop_job(self, name: str) -> dict[str, Any]:
        """``POST /v1/jobs/{name}/stop``: ask for the stop, get the JobPublic."""
        return self._json("POST", f"/v1/jobs/{_segment(name)}/stop")

    def delete_job(self, name: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{name}``: ``{"id", "name", "deleted_at"}``."""
        return self._json("DELETE", f"/v1/jobs/{_segment(name)}")

    def list_checkpoints(self, name: str) -> dict[str, Any]:
        """``GET /v1/jobs/{name}/checkpoints``: ``{"checkpoints": [...]}``, oldest first."""
        return self._json("GET", f"/v1/jobs/{_segment(name)}/checkpoints")

    def fetch_output(
        self, name: str, node_index: int, destination: Path, attempt: int | None = None
    ) -> Fetched:
        """``GET /v1/jobs/{name}/outputs/{node_index}`` into ``destination``: from the store
        the answer redirects to, resumed after a cut, kept only whole and verified. The output
        of ``attempt`` (default: the last attempt that recorded outputs)."""
        path = f"/v1/jobs/{_segment(name)}/outputs/{_segment(node_index)}{_of(attempt)}"
        return self._fetch(path, f"output_{node_index}.zip of job '{name}'", destination)

    def fetch_output_by_id(
        self, job_id: str, node_index: int, destination: Path, attempt: int | None = None
    ) -> Fetched:
        """``GET /v1/audit/jobs/{job_id}/outputs/{node_index}``: a job's output by its id,
        deleted or not, as :meth:`fetch_output` does."""
        path = f"/v1/audit/jobs/{_segment(job_id)}/outputs/{_segment(node_index)}{_of(attempt)}"
        return self._fetch(path, f"output_{node_index}.zip of job {job_id}", destination)

    def _fetch(self, path: str, what: str, destination: Path) -> Fetched:
        try:
            secure = self.ca_file or self.api_url.startswith("https:")  # else made if needed
            return fetch(self._http, path, destination, what=what, patience=FETCH_PATIENCE_S,
                         tls=client_context(self.ca_file) if secure else None)  # fmt: skip
        except Refused as refused:
            raise CliError(" ".join(str(refused).split()), status=refused.status,
                           slug=refused.slug) from None  # fmt: skip
        except Unavailable as error:
            raise CliError(f"{error}; nothing was written: run `flexai training fetch` again "
                           "in a moment (the download resumes where it stopped)") from None
        except Altered as altered:
            raise CliError(f"refused: {altered}; fetch it again, and if it differs again "
                           "the stored archive was altered (tell an operator)") from None

    def iter_logs(
        self, name: str, *, follow: bool = False, offset: int = 0, node_index: int = 0,
        attempt: int | None = None, moved_on: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> Iterator[bytes]:  # fmt: skip
        """``GET /v1/jobs/{name}/logs``: the log bytes of ``attempt`` (default: the job's
        current one, which a reconnection keeps to) from ``offset`` as they come.

        With ``follow`` the server keeps the answer open until the job is terminal, or has
        moved on past the attempt (then ``moved_on(attempt, job)`` is called), and every line
        of the attempt was sent. If the connection breaks on the way, reconnect at the byte
        reached.
        """
        path = f"/v1/jobs/{_segment(name)}/logs"
        params = {"node_index": str(node_index)} if node_index else {}
        if attempt is not None:
            params["attempt"] = str(attempt)

        def finished() -> bool:
            job = self._job(name)
            followed = params.get("attempt")
            if followed is not None and current_attempt(job) > int(followed):
                if moved_on is not None:
                    moved_on(int(followed), job)
                return True
            return str(job["status"]) in TERMINAL

        yield from self._resumed_stream(path, params, offset=offset, follow=follow,
                                        finished=finished, sticky={ATTEMPT_HEADER: "attempt"})

    def _job(self, name: str) -> dict[str, Any]:
        """The job; a transport failure is raised as is (a follower retries it)."""
        response = self._http.get(f"/v1/jobs/{_segment(name)}")
        self._raise_for_problem(response)
        job: dict[str, Any] = response.json()
        return job

    # --- debug sessions ------------------------------------------------------------------

    def open_debug_session(self, name: str, public_key: str, node_index: int = 0) -> dict[str, Any]:
        """``POST /v1/jobs/{name}/debug-sessions``: the DebugSessionPublic (``waiting``)."""
        body = {"public_key": public_key, "node_index": node_index}
        return self._json("POST", f"/v1/jobs/{_segment(name)}/debug-sessions", json=body)

    def debug_session(self, name: str, session_id: str, wait: float = 0) -> dict[str, Any]:
        """``GET /v1/jobs/{name}/debug-sessions/{id}?wait=S``: answered once the node took it."""
        path = f"/v1/jobs/{_segment(name)}/debug-sessions/{_segment(session_id)}"
        return self._json("GET", path, params={"wait": wait},
                          timeout=httpx.Timeout(30.0 + wait, connect=10.0))  # fmt: skip

    def close_debug_session(self, name: str, session_id: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{name}/debug-sessions/{id}``: the session ended (no error twice)."""
        path = f"/v1/jobs/{_segment(name)}/debug-sessions/{_segment(session_id)}"
        return self._json("DELETE", path)

    def debug_stream_target(self, name: str, session_id: str) -> tuple[str, dict[str, str]]:
        """The WebSocket URL of a session's stream, and the header that authenticates it."""
        path = f"/v1/jobs/{_segment(name)}/debug-sessions/{_segment(session_id)}/stream"
        url = "ws" + self.api_url.removeprefix("http") + path
        return url, {"Authorization": self._http.headers["Authorization"]}

    # --- datasets ------------------------------------------------------------------------

    def push_dataset(self, name: str, archive: Iterable[bytes]) -> dict[str, Any]:
        """``PUT /v1/datasets/{name}``: the zip, streamed as it is made; the DatasetPushed."""
        headers = {"Content-Type": "application/zip"}
        return self._json("PUT", f"/v1/datasets/{_segment(name)}", content=archive,
                          headers=headers)  # fmt: skip

    def list_datasets(self) -> dict[str, Any]:
        """``GET /v1/datasets``: ``{"datasets": [DatasetPublic], "count": n}``, by name."""
        return self._json("GET", "/v1/datasets")

    def get_dataset(self, name: str) -> dict[str, Any]:
        """``GET /v1/datasets/{name}``: the DatasetDetail, its versions newest first."""
        return self._json("GET", f"/v1/datasets/{_segment(name)}")

    # --- secrets -------------------------------------------------------------------------

    def create_secret(self, name: str, value: str, *, update: bool = False) -> dict[str, Any]:
        """``POST /v1/secrets`` (409 if the name is taken), or with ``update`` ``PUT
        /v1/secrets/{name}`` (create or replace): the SecretPublic, never the value."""
        if update:
            return self._json("PUT", f"/v1/secrets/{_segment(name)}", json={"value": value})
        return self._json("POST", "/v1/secrets", json={"name": name, "value": value})

    def list_secrets(self) -> dict[str, Any]:
        """``GET /v1/secrets``: ``{"secrets": [SecretPublic], "count": n}``, by name."""
        return self._json("GET", "/v1/secrets")

    def delete_secret(self, name: str) -> dict[str, Any]:
        """``DELETE /v1/secrets/{name}``."""
        return self._json("DELETE", f"/v1/secrets/{_segment(name)}")

    # --- runtimes ------------------------------------------------------------------------

    def list_runtimes(self) -> dict[str, Any]:
        """``GET /v1/runtimes``: ``{"runtimes": [RuntimePublic], "count": n}``, by name."""
        return self._json("GET", "/v1/runtimes")

    def create_runtime(self, name: str, image: str, registry_secret: str | None = None
                       ) -> dict[str, Any]:  # fmt: skip
        """``POST /v1/admin/runtimes`` (409 if the name is taken): the RuntimePublic."""
        body = {"name": name, "image": image, "registry_secret": registry_secret}
        return self._json("POST", "/v1/admin/runtimes", json=body)

    def delete_runtime(self, name: str) -> dict[str, Any]:
        """``DELETE /v1/admin/runtimes/{name}``."""
        return self._json("DELETE", f"/v1/admin/runtimes/{_segment(name)}")

    # --- users and tokens ----------------------------------------------------------------

    def whoami(self) -> dict[str, Any]:
        """``GET /v1/whoami``: who this token acts for."""
        return self._json("GET", "/v1/whoami")

    def create_user(self, name: str, *, admin: bool = False) -> dict[str, Any]:
        """``POST /v1/admin/users``: the user and its first token (shown once)."""
        return self._json("POST", "/v1/admin/users", json={"name": name, "admin": admin})

    def list_users(self) -> dict[str, Any]:
        """``GET /v1/admin/users``."""
        return self._json("GET", "/v1/admin/users")

    def set_quota(self, name: str, accels: int | None) -> dict[str, Any]:
        """``PUT /v1/admin/users/{name}/quota``: its accelerators at once (None: no quota)."""
        return self._json("PUT", f"/v1/admin/users/{_segment(name)}/quota",
                          json={"accels": accels})  # fmt: skip

    def set_high_priority(self, name: str, allowed: bool) -> dict[str, Any]:
        """``PUT /v1/admin/users/{name}/high-priority``: may it submit priority high jobs."""
        return self._json("PUT", f"/v1/admin/users/{_segment(name)}/high-priority",
                          json={"allowed": allowed})  # fmt: skip

    def create_token(self, *, user: str | None = None, label: str = "") -> dict[str, Any]:
        """``POST /v1/tokens``: a token of the caller's (an admin: of ``user``), shown once."""
        body: dict[str, Any] = {"label": label, **({"user": user} if user else {})}
        return self._json("POST", "/v1/tokens", json=body)

    def list_tokens(self, *, user: str | None = None, all_users: bool = False) -> dict[str, Any]:
        """``GET /v1/tokens``: tokens without their values."""
        params: dict[str, Any] = {"all_users": "true"} if all_users else {}
        if user:
            params["user"] = user
        return self._json("GET", "/v1/tokens", params=params)

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        """``DELETE /v1/tokens/{token_id}``."""
        return self._json("DELETE", f"/v1/tokens/{_segment(token_id)}")

    def list_nodes(self) -> dict[str, Any]:
        """``GET /v1/nodes``: ``{"nodes": [...]}``, each node's accelerators, liveness and
        isolation."""
        return self._json("GET", "/v1/nodes")

    def create_node_token(self, node: str, *, label: str = "") -> dict[str, Any]:
        """``POST /v1/admin/node-tokens``: a token for one node's agent, shown once."""
        return self._json("POST", "/v1/admin/node-tokens", json={"node": node, "label": label})

    # --- audit ---------------------------------------------------------------------------

    def audit_jobs(self, name: str) -> dict[str, Any]:
        """``GET /v1/audit/jobs?name=N``: every job that ever had that name."""
        return self._json("GET", "/v1/audit/jobs", params={"name": name})

    def audit_events(self, job_id: str) -> dict[str, Any]:
        """``GET /v1/audit/jobs/{job_id}``: the events of one job, from the ledger."""
        return self._json("GET", f"/v1/audit/jobs/{_segment(job_id)}")

    def admin_verify(
        self, expect_digest: str | None = None, artifacts: str = "shallow"
    ) -> dict[str, Any]:
        """``POST /v1/admin/verify``: the ledger's chain, the views and the artifacts the
        ledger names checked (admin token)."""
        body: dict[str, Any] = {"artifacts": artifacts}
        if expect_digest:
            body["expect_digest"] = expect_digest
        return self._json("POST", "/v1/admin/verify", json=body)

    def admin_purge(self, deleted_before: str) -> dict[str, Any]:
        """``POST /v1/admin/purge``: remove the artifacts of jobs deleted before then."""
        return self._json("POST", "/v1/admin/purge", json={"deleted_before": deleted_before})

    def admin_rebuild(self) -> dict[str, Any]:
        """``POST /v1/admin/rebuild-projections``: start rebuilding the views (admin token)."""
        return self._json("POST", "/v1/admin/rebuild-projections")

    def admin_rebuild_progress(self) -> dict[str, Any]:
        """``GET /v1/admin/rebuild-projections``: the last rebuild's progress."""
        return self._json("GET", "/v1/admin/rebuild-projections")

    def audit_state(
        self, job_id: str, version: int | None = None, at: str | None = None
    ) -> dict[str, Any]:
        """``GET /v1/audit/jobs/{job_id}/state?version=N|at=ISO``: the job folded from the
        ledger as it was then (the AuditJobState)."""
        params: dict[str, Any] = {"version": version, "at": at}
        return self._json("GET", f"/v1/audit/jobs/{_segment(job_id)}/state",
                          params={key: value for key, value in params.items()
                                  if value is not None})  # fmt: skip
