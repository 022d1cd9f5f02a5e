"""The bounds of every value the ledger accepts, so that no stored event can fail a view; a
job's spec, field by field, is :mod:`domain.specs`'.

Each check returns the value it accepted or raises :class:`InvalidValue` naming the field and
what to do. The API's request schemas use the same checks, so a bad value is refused at the
boundary with the field's name, and the model refuses it again should any other caller try.
The rules a client checks too (names, repository URLs) are the wire contract's
(:mod:`common.contract`), said in its words. Integers stay inside 64-bit columns; text holds no
NUL, no control characters (multi-line text may hold newlines and tabs) and no lone surrogates,
which neither UTF-8 nor PostgreSQL stores.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import common.contract as contract
from common.contract import Refusal, quoted

BIGINT_MAX = 2**63 - 1
MAX_ACCELS = 1024
"""Accelerators one node may offer, and one job may ask for per node."""
MAX_NODES = 1024
MAX_EXIT_CODE = 255
MAX_REVISION = 255
MAX_PATH = 1024
MAX_ARGUMENT = 32 * 1024
MAX_ARGUMENTS = 1024
MAX_ENV_KEYS = 1024
MAX_DATASETS = 64
MAX_MESSAGE = 4096
MAX_LABEL = 255
MAX_ACCEL_TYPE = 128
MAX_CHECKPOINT_STRING = 256
MAX_SPEC_BYTES = 128 * 1024
"""A job's whole spec as JSON: every agent poll carries it."""
MAX_TIME_LIMIT_S = 366 * 24 * 3600
MAX_STOP_GRACE_S = 3600
MAX_PORT = 65535
MAX_ADDRESS = 253
MAX_SECRET_VALUE = 64 * 1024
"""A secret's value, in bytes (UTF-8); values live beside the ledger, never in it."""
MIN_SECRET_VALUE = 4
"""A secret's shortest value, in characters: a shorter one, masked in every log of every job
given it, would hide every occurrence of those characters."""
NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")
FAILURE_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
ADDRESS = re.compile(r"[A-Za-z0-9:.\-\[\]%_]{1,253}")
COMMIT = re.compile(r"[0-9a-f]{4,64}")
CONTENT_HASH = re.compile(r"[0-9a-f]{64}")

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
        raise InvalidValue(field, f"{quoted(value, 40)} is not valid: use {rule}")
    return value


def by_contract(check: Callable[[Any], str], value: Any, field: str) -> str:
    """One rule of the wire contract; its refusal, in its words, names ``field``."""
    if not isinstance(value, str):
        raise InvalidValue(field, f"must be text, not {type(value).__name__}")
    try:
        return check(value)
    except Refusal as refusal:
        raise InvalidValue(field, str(refusal)) from None


def check_job_name(name: Any, field: str = "name") -> str:
    return by_contract(contract.check_job_name, name, field)


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


def check_image_digest(digest: Any, field: str = "image_digest") -> str | None:
    """The digest of the image a job ran in (``sha256:`` and 64 hexadecimal digits)."""
    if digest is None:
        return None
    return check_pattern(digest, field, contract.IMAGE_DIGEST, "sha256: and 64 lower-case "
                         "hexadecimal digits")  # fmt: skip


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


# -- names and hashes ----------------------------------------------------------------------


def check_dataset_name(name: Any, field: str = "name") -> str:
    return by_contract(contract.check_dataset_name, name, field)


def check_secret_name(name: Any, field: str = "name") -> str:
    return by_contract(contract.check_secret_name, name, field)


def check_runtime_name(name: Any, field: str = "name") -> str:
    return by_contract(contract.check_runtime_name, name, field)


def check_content_hash(value: Any, field: str = "content_hash") -> str:
    """A dataset version's SHA-256 (of its archive): 64 lower-case hexadecimal digits."""
    return check_pattern(value, field, CONTENT_HASH, "64 lower-case hexadecimal digits (SHA-256)")
