"""A tiny real HTTP server speaking the artifact protocol of docs/design.md: upload sessions
(parts through the API, or to a "store" at presigned-like URLs that take no token), and
downloads answered with the bytes (ranges too) or a 307 to the store. Faults on demand: the
store away (503 with Retry-After), a part URL that expired (403), a download cut midway."""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from tests.fake_http import FakeHandler, serve, server_url

PROBLEM = "https://flexai.dev/problems/"


@dataclass
class Session:
    id: str
    body: dict[str, Any]
    parts: dict[int, bytes] = field(default_factory=dict)
    answer: dict[str, Any] | None = None


@dataclass
class ArtifactPlane:
    """The state behind the server; tests set the faults and read what arrived."""

    token: str = "node-token"
    part_size: int = 64 * 1024
    straight_to_store: bool = False
    """Part targets are absolute URLs of the "store" (S3-like), not API paths."""
    store_down_for: int = 0
    """Answer this many store requests (parts, downloads) with 503 storage-unavailable."""
    expire_parts: int = 0
    """Answer this many part PUTs to the store with 403 (a presigned URL that expired)."""
    cut_downloads: int = 0
    """Cut this many downloads after half their bytes."""
    objects: dict[str, bytes] = field(default_factory=dict)
    """What downloads serve, by path (``/v1/...``), and their recorded SHA-256 (None: none)."""
    recorded_sha: dict[str, str | None] = field(default_factory=dict)
    redirect: bool = False
    """Downloads answer 307 to the store rather than the bytes."""
    sessions: dict[str, Session] = field(default_factory=dict)
    completed: list[tuple[dict[str, Any], dict[str, bytes], dict[str, Any]]] = field(
        default_factory=list
    )
    """Each completed upload: its begin body, the archive's files, the complete body."""
    recorded: dict[tuple[str, str | None, int], dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    """method, path, the Authorization header sent."""
    ranges: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    most_in_flight: int = 0
    url: str = ""

    def session_ids(self) -> list[str]:
        return list(self.sessions)


def serve_plane(plane: ArtifactPlane) -> ThreadingHTTPServer:
    class Handler(FakeHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, method: str, body: bytes) -> None:
            with plane.lock:
                plane.requests.append((method, self.path, self.headers.get("Authorization")))
            path = self.path.split("?")[0]
            if path.startswith("/store/"):
                self.store(method, path, body)
            elif self.headers.get("Authorization") != f"Bearer {plane.token}":
                self.send_json(401, {"type": PROBLEM + "unauthorized", "detail": "no token"})
            else:
                self.api(method, path, body)

        # -- the control plane ----------------------------------------------------------

        def api(self, method: str, path: str, body: bytes) -> None:
            if method == "GET":
                self.download(path)
            elif method == "POST" and (match := re.fullmatch(r"/v1/agent/jobs/(.+)/uploads", path)):
                self.begin(match.group(1), json.loads(body))
            elif method == "POST" and (match := re.fullmatch(r"/v1/agent/uploads/(\w+)/parts",
                                                             path)):  # fmt: skip
                self.targets(match.group(1), json.loads(body)["numbers"])
            elif method == "PUT" and (match := re.fullmatch(r"/v1/agent/uploads/(\w+)/parts/(\d+)",
                                                            path)):  # fmt: skip
                number = self.take_part(match.group(1), int(match.group(2)), body)
                self.send_json(200, {"number": number, "etag": f"local-{number}"})
            elif method == "POST" and (match := re.fullmatch(r"/v1/agent/uploads/(\w+)/complete",
                                                             path)):  # fmt: skip
                self.complete(match.group(1), json.loads(body))
            elif method == "DELETE" and (match := re.fullmatch(r"/v1/agent/uploads/(\w+)", path)):
                plane.sessions.pop(match.group(1), None)
                self.send_json(200, {"id": match.group(1), "aborted": True})
            else:
                self.send_json(404, {"type": PROBLEM + "not-found", "detail": path})

        def begin(self, job_id: str, request: dict[str, Any]) -> None:
            key = (job_id, request["name"], request["node_index"])
            if key in plane.recorded:
                recorded = plane.recorded[key]
                self.send_json(200, {"id": None, "part_size": None, "recorded": recorded})
                return
            with plane.lock:
                upload_id = f"u{len(plane.sessions) + len(plane.completed) + 1}"
                plane.sessions[upload_id] = Session(upload_id, {**request, "job_id": job_id})
            self.send_json(201, {"id": upload_id, "part_size": plane.part_size})

        def targets(self, upload_id: str, numbers: list[int]) -> None:
            if upload_id not in plane.sessions:
                self.send_json(404, {"type": PROBLEM + "upload-not-found", "detail": upload_id})
                return
            base = plane.url if plane.straight_to_store else ""
            where = "/store/parts" if plane.straight_to_store else "/v1/agent/uploads"
            parts = [{"number": n, "url": f"{base}{where}/{upload_id}/parts/{n}?sig=x",
                      "headers": {}} for n in numbers]  # fmt: skip
            self.send_json(200, {"parts": parts})

        def take_part(self, upload_id: str, number: int, data: bytes) -> int:
            with plane.lock:
                plane.in_flight += 1
                plane.most_in_flight = max(plane.most_in_flight, plane.in_flight)
            threading.Event().wait(0.02)  # long enough for the other workers to be in flight
            with plane.lock:
                plane.in_flight -= 1
                plane.sessions[upload_id].parts[number] = data
            return number

        def complete(self, upload_id: str, request: dict[str, Any]) -> None:
            session = plane.sessions.get(upload_id)
            if session is None:
                self.send_json(404, {"type": PROBLEM + "upload-not-found", "detail": upload_id})
                return
            if session.answer is None:
                data = b"".join(session.parts[n["number"]] for n in request["parts"])
                assert len(data) == request["size"], (len(data), request["size"])
                assert hashlib.sha256(data).hexdigest() == request["sha256"]
                with zipfile.ZipFile(io.BytesIO(data)) as archive:
                    files = {info.filename: archive.read(info) for info in archive.infolist()}
                begun = session.body
                session.answer = {"node_index": begun["node_index"], "size": len(data),
                                  "sha256": request["sha256"]}  # fmt: skip
                plane.completed.append((begun, files, request))
                key = (begun["job_id"], begun["name"], begun["node_index"])
                plane.recorded[key] = session.answer
            self.send_json(200, session.answer)

        def download(self, path: str) -> None:
            if path not in plane.objects:
                self.send_json(404, {"type": PROBLEM + "not-found", "detail": path})
                return
            data = plane.objects[path]
            headers = {"X-Flexai-Size": str(len(data))}
            if plane.recorded_sha.get(path):
                headers["X-Flexai-Sha256"] = str(plane.recorded_sha[path])
            if plane.redirect:
                self.send_response(307)
                self.send_header("Location", f"{plane.url}/store/objects{path}?sig=x")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.bytes(data, headers)

        # -- the store ------------------------------------------------------------------

        def store(self, method: str, path: str, body: bytes) -> None:
            if self.headers.get("Authorization"):
                self.send_json(400, {"detail": "a presigned URL takes no other credential"})
                return
            with plane.lock:
                down = plane.store_down_for > 0
                plane.store_down_for -= down
                expired = method == "PUT" and plane.expire_parts > 0
                plane.expire_parts -= expired
            if down:
                self.send_json(503, {"type": PROBLEM + "storage-unavailable", "detail": "away"},
                               {"Retry-After": "0"})
            elif expired:
                self.send_json(403, {"detail": "Request has expired"})
            elif method == "PUT" and (match := re.fullmatch(r"/store/parts/(\w+)/parts/(\d+)",
                                                            path)):  # fmt: skip
                number = self.take_part(match.group(1), int(match.group(2)), body)
                self.send_response(200)
                self.send_header("ETag", f'"store-{number}"')
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif method == "GET" and path.startswith("/store/objects/"):
                self.bytes(plane.objects[path.removeprefix("/store/objects")], {})
            else:
                self.send_json(404, {"detail": path})

        # -- answers --------------------------------------------------------------------

        def bytes(self, data: bytes, headers: dict[str, str]) -> None:
            start = 0
            asked = self.headers.get("Range")
            if asked:
                plane.ranges.append(asked)
                start = int(re.fullmatch(r"bytes=(\d+)-", asked).group(1))  # type: ignore[union-attr]
            with plane.lock:
                cut = plane.cut_downloads > 0
                plane.cut_downloads -= cut
            self.send_response(206 if asked else 200)
            if asked:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            rest = data[start:]
            self.wfile.write(rest[: len(rest) // 2] if cut else rest)
            if cut:
                self.wfile.flush()
                self.close_connection = True

    server = serve(Handler)
    plane.url = server_url(server)
    return server
