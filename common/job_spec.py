"""A job's spec: what its submitter asked for (``JobCreate`` without the name), as the server
records it and as the agent runs it. One typed value from the API's body to the agent, every
field's default here alone; the server stores, the views keep and the agent receives it as the
dictionary :meth:`JobSpec.to_dict` writes, which :meth:`JobSpec.from_dict` reads back, whatever
older code stored (fields added since are absent from older specs and read as their defaults).

The standard library only (and the contract's limits), so that the domain holds it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from common.contract import PRIORITIES

DEFAULT_REQUIREMENTS_PATH = "requirements.txt"
DEFAULT_PRIORITY: Final = "normal"
RUNTIME_FIELDS: Final = ("runtime", "runtime_image", "registry_secret", "registry_secret_owner")
"""What a spec records of its runtime: absent from the dictionary where None (every spec
before runtimes, and every job without one, keeps its shape)."""


def default_preemptible(priority: str) -> bool:
    """Low-priority jobs may be preempted unless they say otherwise; others may not."""
    return priority == "low"


@dataclass(frozen=True)
class JobSpec:
    """What the user asked for, and what the server pinned at submission (the input
    checkpoint's id, the datasets' content hashes, the default time limit)."""

    repository_url: str
    entry_point: tuple[str, ...]
    repository_revision: str | None = None
    requirements_path: str = DEFAULT_REQUIREMENTS_PATH
    accels: int = 1
    nodes: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    """Environment variable -> the name of the owner's secret it is given."""
    datasets: tuple[str, ...] = ()
    dataset_hashes: Mapping[str, str] = field(default_factory=dict)
    """The version of each pushed dataset the job was submitted with, by content hash."""
    dataset_mounts: Mapping[str, str] = field(default_factory=dict)
    """Dataset -> the folder of ``/input`` it is found in, where not its own name."""
    checkpoint: str | None = None
    """The checkpoint asked for by id or name (``--checkpoint``)..."""
    input_checkpoint_id: str | None = None
    """...and the id it named at submission."""
    time_limit_s: int | None = None
    """The job is ended, and fails, once it has run this long; None: no limit."""
    stop_grace_s: float | None = None
    """Seconds between SIGTERM and SIGKILL for this job; None: the agent's ``--stop-grace``."""
    priority: str = DEFAULT_PRIORITY
    preemptible: bool | None = None
    """As asked; None: as its priority has it (:attr:`may_be_preempted` says which)."""
    max_retries: int = 0
    retry_on_exit_codes: tuple[int, ...] = ()
    runtime: str | None = None
    """The runtime asked for (``--runtime``); None: the node's own system (``host``)..."""
    runtime_image: str | None = None
    """...the image it named at submission (``docker://HOST/PATH:TAG``), which the agent pulls
    and runs the job in..."""
    registry_secret: str | None = None
    """...and the secret (``USER:PASSWORD``) the registry is logged in to with, if the runtime
    names one: that secret's name, of ``registry_secret_owner`` (the admin who made the
    runtime), read by the agent from ``/v1/agent/jobs/{id}/registry-credentials``."""
    registry_secret_owner: str | None = None

    # -- what the fields say ------------------------------------------------------------

    @property
    def rank(self) -> int:
        """The priority's rank: high (2) goes before normal (1) before low (0)."""
        return PRIORITIES.index(self.priority)

    @property
    def may_be_preempted(self) -> bool:
        return default_preemptible(self.priority) if self.preemptible is None else self.preemptible

    @property
    def retry_codes(self) -> frozenset[int]:
        """The entry point's exit codes the job is retried on."""
        return frozenset(self.retry_on_exit_codes)

    # -- its dictionary -----------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """A spec from its dictionary, as stored by any version (or as a body gives it): each
        absent or null field takes its default. What it reads was checked where it was
        written (the domain's ``check_spec``): here it is only typed."""
        return cls(
            repository_url=str(data.get("repository_url") or ""),
            entry_point=_strings(data.get("entry_point")),
            repository_revision=data.get("repository_revision") or None,
            requirements_path=data.get("requirements_path") or DEFAULT_REQUIREMENTS_PATH,
            accels=int(_given(data.get("accels"), 1)),
            nodes=int(_given(data.get("nodes"), 1)),
            env=_names(data.get("env")),
            secrets=_names(data.get("secrets")),
            datasets=_strings(data.get("datasets")),
            dataset_hashes=_names(data.get("dataset_hashes")),
            dataset_mounts=_names(data.get("dataset_mounts")),
            checkpoint=data.get("checkpoint") or None,
            input_checkpoint_id=data.get("input_checkpoint_id") or None,
            time_limit_s=None if data.get("time_limit_s") is None else int(data["time_limit_s"]),
            stop_grace_s=_seconds(data.get("stop_grace_s")),
            priority=str(data.get("priority") or DEFAULT_PRIORITY),
            preemptible=None if data.get("preemptible") is None else bool(data["preemptible"]),
            max_retries=int(data.get("max_retries") or 0),
            retry_on_exit_codes=tuple(int(code) for code in data.get("retry_on_exit_codes") or ()),
            runtime=data.get("runtime") or None,
            runtime_image=data.get("runtime_image") or None,
            registry_secret=data.get("registry_secret") or None,
            registry_secret_owner=data.get("registry_secret_owner") or None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The dictionary the ledger stores (its shape unchanged since the first version):
        every field a body gives, the input checkpoint's id; the dataset mounts and hashes
        only for a job with datasets (the mounts only where given), and the sharing fields
        only where they differ from their defaults; the runtime's fields only where set."""
        data: dict[str, Any] = {
            "repository_url": self.repository_url,
            "repository_revision": self.repository_revision,
            "requirements_path": self.requirements_path, "accels": self.accels,
            "nodes": self.nodes, "env": dict(self.env), "secrets": dict(self.secrets),
            "datasets": list(self.datasets), "checkpoint": self.checkpoint,
            "entry_point": list(self.entry_point), "time_limit_s": self.time_limit_s,
            "stop_grace_s": self.stop_grace_s, "input_checkpoint_id": self.input_checkpoint_id,
        }  # fmt: skip
        if self.dataset_mounts:
            data["dataset_mounts"] = dict(self.dataset_mounts)
        if self.datasets:
            data["dataset_hashes"] = dict(self.dataset_hashes)
        if self.priority != DEFAULT_PRIORITY:
            data["priority"] = self.priority
        if self.preemptible not in (None, default_preemptible(self.priority)):
            data["preemptible"] = self.preemptible
        if self.max_retries:
            data["max_retries"] = self.max_retries
        if self.retry_on_exit_codes:
            data["retry_on_exit_codes"] = list(self.retry_on_exit_codes)
        for name in RUNTIME_FIELDS:
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _strings(values: Iterable[Any] | None) -> tuple[str, ...]:
    return tuple(str(value) for value in values or ())


def _names(mapping: Mapping[Any, Any] | None) -> dict[str, str]:
    return {str(key): str(value) for key, value in (mapping or {}).items()}


def _seconds(value: Any) -> float | None:
    """Seconds as given: a whole number stays one (the ledger stores it so)."""
    if value is None or isinstance(value, int | float):
        return value
    return float(value)
