"""Pulling an image with skopeo into an OCI layout, and unpacking it with umoci.

The registry's credentials go to skopeo in an auth file (mode 0600, in a private folder removed
after), never on its command line, where every process of the host could read them
(``/proc/*/cmdline``); skopeo's home is that folder too, so no credential of the agent's own
user is ever sent. A registry is reached over TLS with the system's CAs, but for those the node
allows plain HTTP to (``flexai agent --insecure-registry``). A pull that fails raises
:class:`ImagePullFailed`, which says what the registry answered in words a user acts on.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from node_agent.images.reference import ImageReference
from node_agent.run.processes import run_command

INSPECT_TIMEOUT_S = 120.0
RETRIES = "2"
"""skopeo's own retries of a registry's transient errors."""
LAYOUT_TAG = "image"
ACCEPT_ANY = {"default": [{"type": "insecureAcceptAnything"}]}
"""skopeo's trust policy: the image is pinned by its manifest's digest, not by signatures."""


class ImagePullFailed(Exception):
    """``reason``: ``unauthorized``, ``not found``, ``unreachable``, ``TLS`` or ``failed``."""

    def __init__(self, image: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.image = image
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class RegistryCredentials:
    username: str
    password: str = field(repr=False)

    @classmethod
    def from_secret(cls, value: str) -> RegistryCredentials:
        """A secret's value, ``USER:PASSWORD`` (a token as the password)."""
        username, colon, password = value.strip().partition(":")
        if not colon or not username or not password:
            raise ValueError("a registry secret's value is USER:PASSWORD (or USER:TOKEN)")
        return cls(username, password)


@dataclass(frozen=True)
class Skopeo:
    """How skopeo reaches one image's registry: what a pull's command lines share."""

    home: Path
    """The private folder: skopeo's home, its auth file and trust policy."""
    authenticated: bool
    insecure: bool

    @property
    def options(self) -> list[str]:
        return ["--policy", str(self.home / "policy.json")]

    def source(self, verb_prefix: str) -> list[str]:
        """``--src-authfile``... for ``copy`` (``src-``), ``--authfile``... for ``inspect``."""
        auth = (f"--{verb_prefix}authfile={self.home / 'auth.json'}" if self.authenticated
                else f"--{verb_prefix}no-creds")  # fmt: skip
        tls = f"--{verb_prefix}tls-verify={'false' if self.insecure else 'true'}"
        return [auth, tls, "--retry-times", RETRIES]

    def inspect_argv(self, reference: ImageReference) -> list[str]:
        return ["skopeo", *self.options, "inspect", "--raw", *self.source(""),
                reference.transport]  # fmt: skip

    def copy_argv(self, reference: ImageReference, layout: Path) -> list[str]:
        return ["skopeo", *self.options, "copy", *self.source("src-"), reference.transport,
                f"oci:{layout}:{LAYOUT_TAG}"]  # fmt: skip

    @property
    def env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
               "XDG_CONFIG_HOME": str(self.home), "XDG_RUNTIME_DIR": str(self.home),
               "LC_ALL": "C"}  # fmt: skip
        for proxy in ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy",
                      "no_proxy"):  # fmt: skip
            if proxy in os.environ:
                env[proxy] = os.environ[proxy]
        return env


@contextmanager
def skopeo_for(
    reference: ImageReference, credentials: RegistryCredentials | None, insecure: bool
) -> Iterator[Skopeo]:
    """skopeo's private folder for one pull, removed after: its auth file holds
    ``credentials`` for ``reference``'s registry alone."""
    home = Path(tempfile.mkdtemp(prefix="flexai-pull-"))  # mode 0700
    try:
        _write_private(home / "policy.json", json.dumps(ACCEPT_ANY))
        if credentials is not None:
            token = f"{credentials.username}:{credentials.password}".encode()
            auths = {reference.registry: {"auth": base64.b64encode(token).decode()}}
            _write_private(home / "auth.json", json.dumps({"auths": auths}))
        yield Skopeo(home, credentials is not None, insecure)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def manifest_digest(skopeo: Skopeo, reference: ImageReference) -> str:
    """The digest of the manifest ``reference`` names now (the one it pins, if it does)."""
    if reference.digest:
        return reference.digest
    try:
        done = subprocess.run(skopeo.inspect_argv(reference), env=skopeo.env, capture_output=True,
                              timeout=INSPECT_TIMEOUT_S, cwd=skopeo.home)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise failure(reference, "timeout: no answer from the registry") from None
    except OSError as error:
        raise ImagePullFailed(str(reference), "failed", f"cannot run skopeo: {error}") from None
    if done.returncode != 0:
        raise failure(reference, done.stderr.decode(errors="replace"))
    return "sha256:" + hashlib.sha256(done.stdout).hexdigest()


def copy_image(
    skopeo: Skopeo,
    reference: ImageReference,
    layout: Path,
    log: Callable[[str], None],
    cancel: threading.Event,
) -> bool:
    """Copy ``reference`` into the OCI layout ``layout``, skopeo's progress to ``log``; False
    when ``cancel`` was set meanwhile."""
    recent: deque[str] = deque(maxlen=20)

    def on_line(line: str) -> None:
        if line.strip():
            recent.append(line)
            log(line)

    code = run_command(skopeo.copy_argv(reference, layout), cwd=skopeo.home, env=skopeo.env,
                       on_line=on_line, cancel=cancel)  # fmt: skip
    if code is None:
        return False
    if code != 0:
        raise failure(reference, "\n".join(recent) or f"skopeo exited with code {code}")
    return True


def unpack_argv(layout: Path, bundle: Path, rootless: bool) -> list[str]:
    rootless_flag = ["--rootless"] if rootless else []
    return ["umoci", "unpack", *rootless_flag, "--image", f"{layout}:{LAYOUT_TAG}", str(bundle)]


def unpack_image(
    layout: Path, bundle: Path, log: Callable[[str], None], cancel: threading.Event
) -> bool:
    """The image's root filesystem at ``bundle/rootfs`` (files owned as in the image when the
    agent is root); False when ``cancel`` was set meanwhile."""
    recent: deque[str] = deque(maxlen=10)
    argv = unpack_argv(layout, bundle, rootless=os.geteuid() != 0)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    code = run_command(argv, cwd=layout.parent, env=env, on_line=recent.append, cancel=cancel)
    if code is None:
        return False
    if code != 0:
        said = " ".join(line.strip() for line in recent if line.strip())[-500:]
        raise ImagePullFailed(str(layout), "failed", f"cannot unpack the image: {said}")
    return True


# -- what the registry answered -----------------------------------------------------------------

_SAID = re.compile(r'msg="(?P<msg>(?:[^"\\]|\\.)*)"')
_REASONS: Sequence[tuple[str, re.Pattern[str], str]] = (
    ("unauthorized", re.compile(r"unauthorized|authentication required|401 Unauthorized|"
                                r"invalid username/password|access to the resource is denied|"
                                r"denied:", re.I),
     "check the registry secret's USER:PASSWORD (or token) and that it may pull this image"),
    ("not found", re.compile(r"manifest unknown|name unknown|\bnot found|404 Not Found", re.I),
     "check the image's name and tag"),
    ("TLS", re.compile(r"HTTP response to HTTPS client|x509|certificate|tls:", re.I),
     "the registry must speak TLS with a certificate the system's CAs trust, or be allowed "
     "plain HTTP on this node (flexai agent --insecure-registry HOST:PORT)"),
    ("unreachable", re.compile(r"connection refused|no such host|dial tcp|i/o timeout|"
                               r"network is unreachable|no route to host|timeout|"
                               r"connection reset|EOF", re.I),
     "check that this node can reach the registry (its host, port and network)"),
)  # fmt: skip


def classify(stderr: str) -> tuple[str, str, str]:
    """skopeo's error output read: the reason, what the registry said, what to do."""
    said = [match.group("msg").replace('\\"', '"') for match in _SAID.finditer(stderr)]
    text = said[-1] if said else " ".join(stderr.split())  # the last: skopeo's fatal error
    detail = re.sub(r'^(Error parsing image name|initializing source) "?[^ ]*"?: ', "", text)
    for reason, pattern, advice in _REASONS:
        if pattern.search(text):
            return reason, detail[-400:], advice
    return "failed", detail[-400:], "see the build log"


def failure(reference: ImageReference, stderr: str) -> ImagePullFailed:
    reason, detail, advice = classify(stderr)
    return ImagePullFailed(
        str(reference), reason, f"cannot pull image {reference}: {reason} ({detail}); {advice}"
    )
