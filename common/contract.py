"""The wire contract of the CLI, the control plane and the agent, in one place: the headers they
exchange, a job's statuses, the rules of the names and repository URLs they pass with the one
wording each refusal has, and the limits both ends of a request spell.

The standard library only, so that every side imports it, the domain included. Each rule
raises :class:`Refusal`, whose text is said after the value's name (``job name 'ab' is 2
characters long; use 3 to 63``); each side wraps it in its own error, never rewords it.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

# -- headers --------------------------------------------------------------------------------

AGENT_ID_HEADER = "X-Flexai-Agent-Id"
"""The agent process that sends a node's request (a node is held by one agent at a time)."""
ATTEMPT_HEADER = "X-Flexai-Attempt"
"""The attempt a log answer is of."""
NODES_HEADER = "X-Flexai-Nodes"
"""How many nodes' logs a log answer interleaves."""
POSITION_HEADER = "X-Flexai-Position"
"""The ledger position a write answer was recorded at."""
MIN_POSITION_HEADER = "X-Flexai-Min-Position"
"""A read waits until the views have caught up with this position (read your own writes)."""
SIZE_HEADER = "X-Flexai-Size"
"""The size in bytes of the artifact a download gives (its bytes, or the store's redirect)."""
SHA256_HEADER = "X-Flexai-Sha256"
"""The SHA-256 of that artifact, when the ledger knows it."""

# -- statuses -------------------------------------------------------------------------------


class Status(StrEnum):
    """The statuses of a training job, as users see them (SPEC.md's lifecycle)."""

    PENDING = "pending"
    SCHEDULING = "scheduling"
    REJECTED = "rejected"
    BUILDING = "building"
    IN_PROGRESS = "in progress"
    ENQUEUED = "enqueued"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOP_IN_PROGRESS = "stop in progress"
    STOPPED = "stopped"
    STOP_FAILED = "stop failed"


TERMINAL = frozenset(
    {Status.REJECTED, Status.SUCCEEDED, Status.FAILED, Status.STOPPED, Status.STOP_FAILED}
)
ON_A_NODE = frozenset(
    {Status.BUILDING, Status.ENQUEUED, Status.IN_PROGRESS, Status.STOP_IN_PROGRESS}
)



class Report(StrEnum):
    """What an agent reports of a job on its node (``POST /v1/agent/jobs/{id}/reports``)."""

    BUILT = "built"
    BUILD_FAILED = "build_failed"
    EXITED = "exited"
    FAILED = "failed"
    STOPPED = "stopped"
    STOP_FAILED = "stop_failed"
    LOGS_UNAVAILABLE = "logs_unavailable"


ENDING_REPORTS = frozenset({Report.EXITED, Report.FAILED, Report.STOPPED})
"""The reports that say the entry point ended (they may carry ``ended_at``)."""

# -- limits ---------------------------------------------------------------------------------

MAX_JOB_NAME = 63
MIN_JOB_NAME = 3
MAX_URL = 2048
PRIORITIES = ("low", "normal", "high")
"""A priority's rank is its index: high (2) goes before normal (1) before low (0)."""
MAX_RETRIES = 20
MAX_RETRY_CODES = 16
MAX_SUBMISSIONS = 1000
"""The most jobs one ``POST /v1/jobs`` may carry as a list (a sweep sends more in several)."""
MAX_PAGE = 500
"""The most jobs one page of ``GET /v1/jobs`` lists."""

# -- names ----------------------------------------------------------------------------------


class Refusal(ValueError):
    """A value the contract refuses; its text is said after the value's name."""


def quoted(value: Any, limit: int = 70) -> str:
    """A value as a refusal quotes it back: cut at ``limit``, what is not printable escaped."""
    text = value if isinstance(value, str) else repr(value)
    return repr(text if len(text) <= limit else text[:limit] + "...")


JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{1,61}[A-Za-z0-9]")
JOB_NAME_RULE = (
    "3 to 63 characters of letters, digits, '-' and '_', starting and ending with a letter or "
    "digit"
)
_JOB_NAME_OUTSIDE = re.compile(r"[^A-Za-z0-9_-]")
_EDGE = re.compile(r"[A-Za-z0-9]")


def check_job_name(name: str, *, stem: bool = False) -> str:
    """A job name (:data:`JOB_NAME_RULE`), or with ``stem`` the stem of a sweep's names
    (``STEM-1``, ``STEM-2``, ...: it may be shorter, and end with '-' or '_')."""
    if not stem and JOB_NAME.fullmatch(name):
        return name
    shortest = 1 if stem else MIN_JOB_NAME
    if not shortest <= len(name) <= MAX_JOB_NAME:
        characters = "character" if len(name) == 1 else "characters"
        problem = f"is {len(name)} {characters} long; use {MIN_JOB_NAME} to {MAX_JOB_NAME}"
    elif _JOB_NAME_OUTSIDE.search(name):
        problem = "may hold only letters, digits, '-' and '_'"
    elif not _EDGE.fullmatch(name[0]) or not (stem or _EDGE.fullmatch(name[-1])):
        problem = f"must start {'' if stem else 'and end '}with a letter or a digit"
    else:
        return name
    raise Refusal(f"{quoted(name)} {problem}")


DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
DATASET_RULE = "1 to 128 letters, digits, '.', '-' and '_', starting with a letter or digit"
SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
SECRET_RULE = "1 to 63 letters, digits, '.', '-' and '_', starting with a letter or digit"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")


def check_pattern(value: Any, pattern: re.Pattern[str], rule: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise Refusal(f"{quoted(value, 40)} is not valid: use {rule}")
    return value


def check_dataset_name(name: Any) -> str:
    return check_pattern(name, DATASET_NAME, DATASET_RULE)


def check_secret_name(name: Any) -> str:
    return check_pattern(name, SECRET_NAME, SECRET_RULE)


RUNTIME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
RUNTIME_RULE = "1 to 63 letters, digits, '.', '-' and '_', starting with a letter or digit"
HOST_RUNTIME = "host"
"""The runtime of a job that runs on the node's own system, in no image (no ``--runtime``)."""


def check_runtime_name(name: Any) -> str:
    return check_pattern(name, RUNTIME_NAME, RUNTIME_RULE)


def check_env_name(name: Any) -> str:
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        raise Refusal(f"{quoted(name, 40)} is not an environment variable name (1 to 255 "
                      "letters, digits and '_', not starting with a digit)")  # fmt: skip
    return name


# -- repository URLs ------------------------------------------------------------------------

REPOSITORY_KINDS = {
    "https": "https://", "http": "http://", "ssh": "ssh://", "git": "git://",
    "scp": "user@host:path", "file": "an absolute path or file://",
}  # fmt: skip
"""Every kind of repository URL a job may name, and how each is written; a server accepts
those of its ``--allowed-repo-schemes`` (:data:`DEFAULT_REPOSITORY_KINDS` by default)."""
DEFAULT_REPOSITORY_KINDS = ("https", "ssh", "scp", "file")
_TRANSPORT_HELPER = re.compile(r"[A-Za-z0-9+.-]*::")
_URL_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_SCHEME_KINDS = {"https": "https", "http": "http", "ssh": "ssh", "git+ssh": "ssh",
                 "ssh+git": "ssh", "git": "git", "file": "file"}  # fmt: skip
_SCP_FORM = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9][A-Za-z0-9.-]*:[^:]")
_WHAT_TO_GIVE = "give an https://, ssh:// or git@host:path URL, or an absolute path"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def looks_remote(url: str) -> bool:
    """A URL rather than a local path: it has a scheme or is git's ``[user@]host:path``."""
    return "://" in url or bool(re.match(r"[^/:]+:", url))


def repository_kind(url: str) -> str:
    """The kind (a key of :data:`REPOSITORY_KINDS`) of a repository URL git may be given.

    Refused: text that git would read as an option (``--upload-pack=...``) or as a transport
    helper (``ext::sh -c ...``, ``fd::``), an unknown scheme (git runs ``git-remote-<scheme>``),
    an ssh host or user that ssh would read as an option, a relative path, a control character.
    """
    shown = quoted(url, 40)
    if url.startswith("-"):
        raise Refusal(f"{shown} starts with '-', which git reads as an option; {_WHAT_TO_GIVE}")
    if _TRANSPORT_HELPER.match(url):
        raise Refusal(f"{shown} names a git transport helper ('::'), which runs commands; "
                      f"{_WHAT_TO_GIVE}")  # fmt: skip
    if _CONTROL.search(url):
        raise Refusal(f"{shown} holds a control character; {_WHAT_TO_GIVE}")
    if any(character.isspace() for character in url) and not url.startswith(("/", "file://")):
        raise Refusal(f"{shown} holds a space; {_WHAT_TO_GIVE}")
    scheme = _URL_SCHEME.match(url)
    if scheme is None:
        if url.startswith("/"):
            return "file"
        if _SCP_FORM.match(url):
            return "scp"
        raise Refusal(f"{shown} is a relative path or not a URL; {_WHAT_TO_GIVE}")
    kind = _SCHEME_KINDS.get(scheme.group(1).lower())
    if kind is None:
        raise Refusal(f"{shown} has the unknown scheme '{scheme.group(1)}'; {_WHAT_TO_GIVE}")
    authority = url[scheme.end():].split("/", 1)[0]
    if ":" in authority.rpartition("@")[0]:
        raise Refusal("holds a password or token (user:SECRET@host), which the ledger would "
                      "keep for good and show in inspect and the build log; give the URL "
                      "without it and let the nodes' git authenticate (an ssh key or a "
                      "credential helper of the agent's user)")  # fmt: skip
    if kind != "file" and (not authority or any(
            part.startswith("-") for part in authority.replace("@", ":").split(":"))):
        raise Refusal(f"{shown} has no host, or a host or user starting with '-'; "
                      f"{_WHAT_TO_GIVE}")  # fmt: skip
    return kind


# -- container images -----------------------------------------------------------------------

IMAGE_TRANSPORT = "docker://"
MAX_IMAGE_REF = 512
_IMAGE_REF = re.compile(
    r"(?P<host>(?:localhost|[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+)(?::[0-9]{1,5})?)"
    r"(?P<path>(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+)"
    r"(?P<tag>:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?P<digest>@sha256:[0-9a-f]{64})?"
)
IMAGE_REF_RULE = (
    "docker://HOST[:PORT]/PATH[:TAG][@sha256:DIGEST], e.g. "
    "docker://nvcr.io/nvidia/pytorch:25.06-py3 (the registry's host is needed: "
    "docker.io/library/ubuntu:24.04, not ubuntu:24.04)"
)
IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def check_image_ref(ref: Any) -> str:
    """A container image's reference in the form skopeo pulls, ``docker://`` written out: a
    bare ``HOST/PATH...`` is taken as ``docker://HOST/PATH...``."""
    if not isinstance(ref, str) or len(ref) > MAX_IMAGE_REF:
        raise Refusal(f"{quoted(ref, 40)} is not an image reference: use {IMAGE_REF_RULE}")
    bare = ref.removeprefix(IMAGE_TRANSPORT)
    if "://" in bare:
        raise Refusal(f"{quoted(ref)} names another transport than docker://: use "
                      f"{IMAGE_REF_RULE}")  # fmt: skip
    if not _IMAGE_REF.fullmatch(bare):
        raise Refusal(f"{quoted(ref)} is not an image reference: use {IMAGE_REF_RULE}")
    return IMAGE_TRANSPORT + bare


def image_key(ref: str) -> str | None:
    """The one spelling of an image reference by which the images nodes hold are matched with
    jobs' and runtimes' (None: not an image reference): ``docker://`` written out, Docker
    Hub's ``library/`` too, a pinned digest without its tag, else the tag (``latest`` when
    none), as the agent's cache names it."""
    match = _IMAGE_REF.fullmatch(ref.removeprefix(IMAGE_TRANSPORT))
    if match is None:
        return None
    path = match["path"]
    if match["host"] == "docker.io" and path.count("/") == 1:
        path = "/library" + path
    return IMAGE_TRANSPORT + match["host"] + path + (match["digest"] or match["tag"] or ":latest")
