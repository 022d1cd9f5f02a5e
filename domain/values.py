"""The bounds of every value the ledger accepts, so that no stored event can fail a view.

Each check returns the value it accepted or raises :class:`InvalidValue` naming the field and
what to do. The API's request schemas use the same checks, so a bad value is refused at the
boundary with the field's name, and the model refuses it again should any other caller try.
Integers stay inside 64-bit columns; text holds no NUL, no control characters (multi-line text
may hold newlines and tabs) and no lone surrogates, which neither UTF-8 nor PostgreSQL stores.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

BIGINT_MAX = 2**63 - 1
MAX_ACCELS = 1024
"""Accelerators one node may offer, and one job may ask for per node."""
MAX_NODES = 1024
MAX_EXIT_CODE = 255
MAX_URL = 2048
MAX_REVISION = 255
MAX_PATH = 1024
MAX_ARGUMENT = 32 * 1024
MAX_ARGUMENTS = 1024
MAX_ENV_KEYS = 1024
MAX_ENV_KEY = 255
MAX_DATASETS = 64
MAX_MESSAGE = 4096
MAX_LABEL = 255
MAX_ACCEL_TYPE = 128
MAX_CHECKPOINT_STRING = 256
MAX_SPEC_BYTES = 128 * 1024
MAX_TIME_LIMIT_S = 366 * 24 * 3600
MAX_STOP_GRACE_S = 3600
MAX_PORT = 65535
MAX_ADDRESS = 253
"""A job's whole spec as JSON: every agent poll carries it."""

NAME_RULE = "3 to 63 characters of letters, digits, '-' and '_', starting and ending with a letter or digit"  # noqa: E501
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{1,61}[A-Za-z0-9]")
NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
SECRET_RULE = "1 to 63 letters, digits, '.', '-' and '_', starting with a letter or digit"
MAX_SECRET_VALUE = 64 * 1024
"""A secret's value, in bytes (UTF-8); values live beside the ledger, never in it."""
MIN_SECRET_VALUE = 4
"""A secret's shortest value, in characters: a shorter one, masked in every log of every job
given it, would hide every occurrence of those characters."""
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
FAILURE_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
ADDRESS = re.compile(r"[A-Za-z0-9:.\-\[\]%_]{1,253}")
COMMIT = re.compile(r"[0-9a-f]{4,64}")

_SINGLE_LINE_BAD = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_MULTI_LINE_BAD = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


class InvalidValue(ValueError):
    """A value outside its bounds; ``field`` names it (``env.LR``, ``entry_point[2]``)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field} {problem}")


def _describe(character: str) -> str:
    code = ord(character)
    return "a NUL byte" if code == 0 else f"the control character U+{code:04X}"


def check_text(
    value: Any, field: str, *, max_length: int, multiline: bool = False, required: bool = True
) -> str:
    """Text of 1 (0 when not ``required``) to ``max_length`` characters, free of control codes."""
    if not isinstance(value, str):
        raise InvalidValue(field, f"must be text, not {type(value).__name__}")
    if required and not value:
        raise InvalidValue(field, "must not be empty")
    if len(value) > max_length:
        raise InvalidValue(
            field, f"is {len(value)} characters long; at most {max_length} are allowed"
        )
    bad = (_MULTI_LINE_BAD if multiline else _SINGLE_LINE_BAD).search(value)
    if bad is not None:
        what = _describe(bad.group())
        if 0xD800 <= ord(bad.group()) <= 0xDFFF:
            what = "a lone surrogate (not valid Unicode)"
        raise InvalidValue(field, f"holds {what} at position {bad.start()}; remove it")
    return value


def check_int(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue(field, f"must be a whole number, not {value!r:.40}")
    if not low <= value <= high:
        raise InvalidValue(field, f"must be from {low} to {high}, not {str(value)[:40]}")
    return value


def check_pattern(value: Any, field: str, pattern: re.Pattern[str], rule: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        shown = check_printable_preview(value)
        raise InvalidValue(field, f"{shown} is not valid: use {rule}")
    return value


def check_printable_preview(value: Any, limit: int = 40) -> str:
    """A value as it may be quoted back in an error message: short, with controls escaped."""
    text = value if isinstance(value, str) else repr(value)
    escaped = text.encode("unicode_escape", errors="backslashreplace").decode("ascii")
    return repr(escaped if len(escaped) <= limit else escaped[:limit] + "...")


def check_job_name(name: Any, field: str = "name") -> str:
    return check_pattern(name, field, JOB_NAME, NAME_RULE)


def check_node_name(name: Any, field: str = "name") -> str:
    return check_pattern(
        name, field, NODE_NAME,
        "1 to 253 characters of letters, digits, '.', '-' and '_', starting and ending with "
        "a letter or digit (a host name)",
    )  # fmt: skip


def check_failure_code(code: Any, field: str = "code") -> str:
    return check_pattern(code, field, FAILURE_CODE, "a code like revision_not_found")


def check_commit(commit: Any, field: str = "commit") -> str | None:
    if commit is None:
        return None
    return check_pattern(commit, field, COMMIT, "4 to 64 lower-case hexadecimal digits")


def check_message(message: Any, field: str = "message") -> str:
    return check_text(message, field, max_length=MAX_MESSAGE, multiline=True)


def check_accelerators(indices: Any, field: str = "accelerators") -> list[int]:
    if not isinstance(indices, list | tuple):
        raise InvalidValue(field, "must be a list of accelerator indices")
    if len(indices) > MAX_ACCELS:
        raise InvalidValue(field, f"lists {len(indices)} indices; at most {MAX_ACCELS}")
    checked = [check_int(index, f"{field}[{i}]", 0, MAX_ACCELS - 1)
               for i, index in enumerate(indices)]  # fmt: skip
    if len(set(checked)) != len(checked):
        raise InvalidValue(field, "names an accelerator twice")
    return checked


def check_moment(value: Any, field: str) -> datetime:
    """ISO 8601 text of a moment with its offset (``2026-12-05T16:00:00+00:00``)."""
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None or len(value) > 40:
        raise InvalidValue(field, f"must be an ISO 8601 moment with its offset, not {value!r:.40}")
    return moment


def check_exit_code(code: Any, field: str = "exit_code") -> int:
    return check_int(code, field, 0, MAX_EXIT_CODE)


def check_port(port: Any, field: str = "master_port") -> int:
    return check_int(port, field, 1, MAX_PORT)


def check_address(address: Any, field: str = "address") -> str:
    """A host name or IP address peers use to reach a node."""
    return check_pattern(
        address, field, ADDRESS, "a host name or an IPv4/IPv6 address, at most 253 characters"
    )


ROOT_CHECKPOINT = ""
"""The name of the checkpoint the files at the root of the checkpoint folder make (where the
Hugging Face Trainer saves its final model): the job's final checkpoint, as FlexAI names it."""


def check_checkpoint_name(name: Any, field: str = "checkpoint_name") -> str:
    if name == ROOT_CHECKPOINT:
        return name
    check_text(name, field, max_length=MAX_LABEL)
    if "/" in name or "\\" in name or name in (".", ".."):
        raise InvalidValue(field, "must be one file or directory name, without '/' or '..'")
    return name


def check_optional(value: Any, field: str, max_length: int) -> str | None:
    return None if value is None else check_text(value, field, max_length=max_length)


def _check_relative_path(value: Any, field: str) -> str:
    check_text(value, field, max_length=MAX_PATH)
    if value.startswith("/") or ".." in value.split("/"):
        raise InvalidValue(field, "must be a path inside the repository, relative to its "
                                  "root (no leading '/', no '..')")  # fmt: skip
    return value


# -- repository URLs ------------------------------------------------------------------------

REPOSITORY_KINDS = {
    "https": "https://", "http": "http://", "ssh": "ssh://", "git": "git://",
    "scp": "user@host:path", "file": "an absolute path or file://",
}  # fmt: skip
"""Every kind of repository URL a job may name, and how each is written; a server accepts
those of its ``--allowed-repo-schemes`` (:data:`DEFAULT_REPOSITORY_KINDS` by default)."""
DEFAULT_REPOSITORY_KINDS = ("https", "ssh", "scp", "file")
_URL_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_SCHEME_KINDS = {"https": "https", "http": "http", "ssh": "ssh", "git+ssh": "ssh",
                 "ssh+git": "ssh", "git": "git", "file": "file"}  # fmt: skip
_TRANSPORT_HELPER = re.compile(r"[A-Za-z0-9+.-]*::")
_SCP_FORM = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9][A-Za-z0-9.-]*:[^:]")
_WHAT_TO_GIVE = "give an https://, ssh:// or git@host:path URL, or an absolute path"


def repository_kind(url: Any, field: str = "repository_url") -> str:
    """The kind (a key of :data:`REPOSITORY_KINDS`) of a repository URL git may be given.

    Refused: text that git would read as an option (``--upload-pack=...``) or as a transport
    helper (``ext::sh -c ...``, ``fd::``), an unknown scheme (git runs ``git-remote-<scheme>``),
    an ssh host or user that ssh would read as an option, a relative path.
    """
    check_text(url, field, max_length=MAX_URL)
    shown = check_printable_preview(url)
    if url.startswith("-"):
        raise InvalidValue(field, f"{shown} starts with '-', which git reads as an option; "
                                  f"{_WHAT_TO_GIVE}")  # fmt: skip
    if _TRANSPORT_HELPER.match(url):
        raise InvalidValue(field, f"{shown} names a git transport helper ('::'), which runs "
                                  f"commands; {_WHAT_TO_GIVE}")  # fmt: skip
    if any(character.isspace() for character in url) and not url.startswith(("/", "file://")):
        raise InvalidValue(field, f"{shown} holds a space; {_WHAT_TO_GIVE}")
    scheme = _URL_SCHEME.match(url)
    if scheme is not None:
        kind = _SCHEME_KINDS.get(scheme.group(1).lower())
        if kind is None:
            raise InvalidValue(field, f"{shown} has the unknown scheme '{scheme.group(1)}'; "
                                      f"{_WHAT_TO_GIVE}")  # fmt: skip
        authority = url[scheme.end():].split("/", 1)[0]
        if ":" in authority.rpartition("@")[0]:
            raise InvalidValue(field, "holds a password or token (user:SECRET@host), which the "
                                      "ledger would keep for good and show in inspect and the "
                                      "build log; give the URL without it and let the nodes' git "
                                      "authenticate (an ssh key or a credential helper of the "
                                      "agent's user)")  # fmt: skip
        if kind != "file" and (not authority or any(
                part.startswith("-") for part in authority.replace("@", ":").split(":"))):
            raise InvalidValue(field, f"{shown} has no host, or a host or user starting with "
                                      f"'-'; {_WHAT_TO_GIVE}")  # fmt: skip
        return kind
    if url.startswith("/"):
        return "file"
    if _SCP_FORM.match(url):
        return "scp"
    raise InvalidValue(field, f"{shown} is a relative path or not a URL; {_WHAT_TO_GIVE}")


def check_repository_url(
    url: Any, field: str = "repository_url", allowed: Any = tuple(REPOSITORY_KINDS)
) -> str:
    """A repository URL of one of the ``allowed`` kinds (see :func:`repository_kind`)."""
    kind = repository_kind(url, field)
    if kind not in allowed:
        accepted = ", ".join(REPOSITORY_KINDS[name] for name in REPOSITORY_KINDS
                             if name in allowed)  # fmt: skip
        raise InvalidValue(
            field, f"is a {REPOSITORY_KINDS[kind]} URL, which this control plane does not "
            f"accept: give {accepted or 'none (no kind is allowed)'} (the server's "
            "--allowed-repo-schemes)",
        )  # fmt: skip
    return url


def _check_revision(value: Any, field: str) -> str | None:
    if value is None:
        return None
    check_text(value, field, max_length=MAX_REVISION)
    if value.startswith("-"):
        raise InvalidValue(field, "must not start with '-': give a branch, tag or commit")
    return value


def _check_mapping(value: Any, field: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise InvalidValue(field, "must be an object of names and values")
    if len(value) > MAX_ENV_KEYS:
        raise InvalidValue(field, f"has {len(value)} entries; at most {MAX_ENV_KEYS}")
    for key in value:
        check_pattern(key, f"{field} key", ENV_KEY,
                      "a variable name of letters, digits and '_' not starting with a digit")
    return value  # fmt: skip


def check_env(env: Any, field: str = "env") -> dict[str, str]:
    checked = _check_mapping(env, field)
    return {key: check_text(value, f"{field}.{key}", max_length=MAX_ARGUMENT,
                            multiline=True, required=False)
            for key, value in checked.items()}  # fmt: skip


def check_secret_name(name: Any, field: str = "name") -> str:
    return check_pattern(name, field, SECRET_NAME, SECRET_RULE)


def check_secrets(secrets: Any, field: str = "secrets") -> dict[str, str]:
    """``--secret`` variables and the names of the secrets they take their values from."""
    checked = _check_mapping(secrets, field)
    return {key: check_secret_name(value, f"{field}.{key}")
            for key, value in checked.items()}  # fmt: skip


PLATFORM_VARIABLES = frozenset({
    "CUDA_VISIBLE_DEVICES", "VIRTUAL_ENV", "PYTHONUNBUFFERED", "HOME", "XDG_CONFIG_HOME",
    "NODE_RANK", "NNODES", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
})  # fmt: skip
"""The variables the node sets for every job (with every ``FLEXAI_`` one): a job's own value
would be overridden, so it is refused rather than dropped without a word."""


def check_no_shared_variables(env: Mapping[str, Any], secrets: Mapping[str, Any]) -> None:
    """A variable comes from ``--env`` or from ``--secret``, never both, and never from either
    when the node sets it (:data:`PLATFORM_VARIABLES`)."""
    for field, names in (("env", env), ("secrets", secrets)):
        taken = sorted(name for name in names
                       if name in PLATFORM_VARIABLES or name.startswith("FLEXAI_"))  # fmt: skip
        if taken:
            raise InvalidValue(
                f"{field}.{taken[0]}", "is set by the platform on every node (the job's "
                "accelerators, directories and rendezvous): read it in the job instead of "
                "setting it, or name your variable otherwise",
            )  # fmt: skip
    both = sorted(set(env) & set(secrets))
    if both:
        raise InvalidValue(
            f"secrets.{both[0]}", "is also given with --env: a variable takes its value from "
            "--env or from --secret, not both; drop one of them",
        )  # fmt: skip


def split_dataset(item: str) -> tuple[str, str]:
    """``NAME`` or ``NAME=MOUNT`` (FlexAI's form): the dataset, and the folder of ``/input``
    the job finds it in."""
    name, _, mount = item.partition("=")
    return name, mount or name


def check_datasets(datasets: Any, field: str = "datasets") -> list[str]:
    """Datasets as a job names them: ``NAME``, or ``NAME=MOUNT`` to find NAME at
    ``/input/MOUNT``; each dataset once, each mount once."""
    if not isinstance(datasets, list | tuple):
        raise InvalidValue(field, "must be a list of dataset names")
    if len(datasets) > MAX_DATASETS:
        raise InvalidValue(field, f"lists {len(datasets)} datasets; at most {MAX_DATASETS}")
    for i, item in enumerate(datasets):
        check_text(item, f"{field}[{i}]", max_length=2 * MAX_LABEL + 1)
        name, mount = split_dataset(item)
        check_dataset_name(name, f"{field}[{i}]")
        if mount != name:
            check_dataset_name(mount, f"{field}[{i}] (its mount, after '=')")
    pairs = [split_dataset(item) for item in datasets]
    for i, (name, mount) in enumerate(pairs):
        if name in [earlier for earlier, _ in pairs[:i]]:
            raise InvalidValue(f"{field}[{i}]", f"{name!r} is given twice: give each dataset once")
        if mount in [earlier for _, earlier in pairs[:i]]:
            raise InvalidValue(f"{field}[{i}]", f"two datasets would be mounted at /input/{mount}: "
                               "give each its own (NAME=MOUNT)")  # fmt: skip
    return list(datasets)


def check_dataset_mounts(mounts: Any, datasets: Any, field: str = "dataset_mounts") -> None:
    """Where each dataset given as ``NAME=MOUNT`` is mounted (the others at their name)."""
    if not isinstance(mounts, dict):
        raise InvalidValue(field, "must be an object of dataset names and mount folders")
    listed = list(datasets) if isinstance(datasets, list | tuple) else []
    for name, mount in mounts.items():
        if name not in listed:
            raise InvalidValue(f"{field}.{str(name)[:40]}", "is not one of the job's datasets")
        check_dataset_name(mount, f"{field}.{name}")
    check_datasets([f"{name}={mounts.get(name, name)}" for name in listed], field)


def check_entry_point(entry_point: Any, field: str = "entry_point") -> list[str]:
    if not isinstance(entry_point, list | tuple) or not entry_point:
        raise InvalidValue(field, "is required: give it after `--`")
    if len(entry_point) > MAX_ARGUMENTS:
        raise InvalidValue(field, f"has {len(entry_point)} parts; at most {MAX_ARGUMENTS}")
    return [check_text(part, f"{field}[{i}]", max_length=MAX_ARGUMENT, multiline=True,
                       required=i == 0)
            for i, part in enumerate(entry_point)]  # fmt: skip
    # The program must be named; an argument may be empty (`train.py --tag ''`).


SPEC_FIELDS = {
    "repository_url", "repository_revision", "requirements_path", "accels", "nodes", "env",
    "secrets", "datasets", "dataset_hashes", "dataset_mounts",
    "checkpoint", "entry_point", "input_checkpoint_id", "time_limit_s",
    "stop_grace_s", "priority", "preemptible", "max_retries", "retry_on_exit_codes",
}  # fmt: skip


def check_spec(spec: Mapping[str, Any]) -> None:
    """Every field of a job's spec (JobCreate without the name) within its bounds."""
    unknown = sorted(set(spec) - SPEC_FIELDS)
    if unknown:
        raise InvalidValue(unknown[0], "is not a field of a job")
    if not spec.get("repository_url"):
        raise InvalidValue("repository_url", "is required (--repository-url)")
    check_repository_url(spec["repository_url"], "repository_url")
    _check_revision(spec.get("repository_revision"), "repository_revision")
    _check_relative_path(spec.get("requirements_path", "requirements.txt"), "requirements_path")
    check_int(spec.get("accels"), "accels", 1, MAX_ACCELS)
    check_int(spec.get("nodes"), "nodes", 1, MAX_NODES)
    check_env(spec.get("env") or {})
    check_secrets(spec.get("secrets") or {})
    check_no_shared_variables(spec.get("env") or {}, spec.get("secrets") or {})
    check_datasets(spec.get("datasets") or [])
    check_dataset_hashes(spec.get("dataset_hashes") or {}, spec.get("datasets") or [])
    check_dataset_mounts(spec.get("dataset_mounts") or {}, spec.get("datasets") or [])
    check_optional(spec.get("checkpoint"), "checkpoint", MAX_LABEL)
    check_optional(spec.get("input_checkpoint_id"), "input_checkpoint_id", MAX_LABEL)
    check_entry_point(spec.get("entry_point"))
    if spec.get("time_limit_s") is not None:
        check_int(spec["time_limit_s"], "time_limit_s", 1, MAX_TIME_LIMIT_S)
    if spec.get("stop_grace_s") is not None:
        check_int(spec["stop_grace_s"], "stop_grace_s", 0, MAX_STOP_GRACE_S)
    size = len(json.dumps(spec, ensure_ascii=False).encode())
    if size > MAX_SPEC_BYTES:
        raise InvalidValue(
            "spec", f"is {size} bytes as JSON; at most {MAX_SPEC_BYTES} are accepted: pass "
            "large settings in a file of the repository instead of --env or arguments",
        )  # fmt: skip


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value) if abs(value) < 1e308 else math.inf
    return number if math.isfinite(number) else None


def _step(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= BIGINT_MAX else None


def _label(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    cleaned = _SINGLE_LINE_BAD.sub("", value)[:MAX_CHECKPOINT_STRING]
    return cleaned or None


def clean_checkpoint_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint's own files claim (step, losses, model), kept only where it fits.

    These come from files a job wrote, so they are data, not requests: a value out of bounds is
    dropped (shown as unknown) rather than refused.
    """
    size = facts.get("size")
    return {
        "size": size if isinstance(size, int) and 0 <= size <= BIGINT_MAX else None,
        "step": _step(facts.get("step")),
        "train_loss": _finite(facts.get("train_loss")),
        "eval_loss": _finite(facts.get("eval_loss")),
        "model": _label(facts.get("model")),
        "version": _label(facts.get("version")),
        "inference_ready": bool(facts.get("inference_ready")),
    }


# -- datasets -------------------------------------------------------------------------------

DATASET_RULE = "1 to 128 letters, digits, '.', '-' and '_', starting with a letter or digit"
CONTENT_HASH = re.compile(r"[0-9a-f]{64}")


def check_dataset_name(name: Any, field: str = "name") -> str:
    return check_pattern(name, field, DATASET_NAME, DATASET_RULE)


def check_content_hash(value: Any, field: str = "content_hash") -> str:
    """A dataset version's SHA-256 (of its archive): 64 lower-case hexadecimal digits."""
    return check_pattern(value, field, CONTENT_HASH, "64 lower-case hexadecimal digits (SHA-256)")


def check_dataset_hashes(
    hashes: Any, datasets: Any, field: str = "dataset_hashes"
) -> dict[str, str]:
    """The dataset versions a job was given: datasets of the job's, each pinned to a hash."""
    if not isinstance(hashes, Mapping):
        raise InvalidValue(field, "must be an object of dataset names and content hashes")
    listed = datasets if isinstance(datasets, list | tuple) else ()
    asked = {name for name in listed if isinstance(name, str)}
    for name, content_hash in hashes.items():
        check_dataset_name(name, f"{field} key")
        if name not in asked:
            raise InvalidValue(f"{field}.{name}", "is not one of the job's datasets")
        check_content_hash(content_hash, f"{field}.{name}")
    return dict(hashes)
