"""The bounds of a job's spec, field by field (JobCreate without the name): its repository,
environment, secrets, datasets and entry point, and the whole spec's size. Each check returns
the value it accepted or raises :class:`~domain.values.InvalidValue` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import common.contract as contract
from common.contract import MAX_URL, REPOSITORY_KINDS
from domain.values import (
    MAX_ACCELS,
    MAX_ARGUMENT,
    MAX_ARGUMENTS,
    MAX_DATASETS,
    MAX_ENV_KEYS,
    MAX_LABEL,
    MAX_NODES,
    MAX_PATH,
    MAX_REVISION,
    MAX_SPEC_BYTES,
    MAX_STOP_GRACE_S,
    MAX_TIME_LIMIT_S,
    InvalidValue,
    by_contract,
    check_content_hash,
    check_dataset_name,
    check_int,
    check_optional,
    check_runtime_name,
    check_secret_name,
    check_text,
)


def _check_relative_path(value: Any, field: str) -> str:
    check_text(value, field, max_length=MAX_PATH)
    if value.startswith("/") or ".." in value.split("/"):
        raise InvalidValue(field, "must be a path inside the repository, relative to its "
                                  "root (no leading '/', no '..')")  # fmt: skip
    return value


# -- repository URLs ------------------------------------------------------------------------


def repository_kind(url: Any, field: str = "repository_url") -> str:
    """The kind (a key of :data:`REPOSITORY_KINDS`) of a repository URL git may be given: the
    wire contract's rule (:func:`common.contract.repository_kind`), on text of its bounds."""
    check_text(url, field, max_length=MAX_URL)
    return by_contract(contract.repository_kind, url, field)


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
        by_contract(contract.check_env_name, key, f"{field} key")
    return value


def check_env(env: Any, field: str = "env") -> dict[str, str]:
    checked = _check_mapping(env, field)
    return {key: check_text(value, f"{field}.{key}", max_length=MAX_ARGUMENT,
                            multiline=True, required=False)
            for key, value in checked.items()}  # fmt: skip


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
    "runtime", "runtime_image", "registry_secret", "registry_secret_owner",
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
    check_runtime(spec)
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


def check_runtime(spec: Mapping[str, Any]) -> None:
    """The runtime a job asked for, the image it was pinned to and the secret its registry
    is logged in to with (a name of a secret's owner's)."""
    if spec.get("runtime") is not None:
        check_runtime_name(spec["runtime"], "runtime")
    if spec.get("runtime_image") is not None:
        by_contract(contract.check_image_ref, spec["runtime_image"], "runtime_image")
    if spec.get("registry_secret") is not None:
        check_secret_name(spec["registry_secret"], "registry_secret")
        check_text(spec.get("registry_secret_owner"), "registry_secret_owner",
                   max_length=MAX_LABEL)  # fmt: skip
