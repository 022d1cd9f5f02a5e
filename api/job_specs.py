"""What a submitted job's spec records, beyond what its body asks: the input checkpoint,
datasets and runtime it names pinned to the ids, contents and image they have now, and the
server's default time limit where it sets none. Single and list submissions alike call it
(``routes/jobs.py``, ``routes/submissions.py``); what it refuses, it says in
:class:`SpecRefused`, which the HTTP layer answers as it is."""

from __future__ import annotations

from dataclasses import replace

from api.runtimes import Runtime
from api.services import Services
from common.contract import HOST_RUNTIME
from common.job_spec import JobSpec
from domain.specs import check_repository_url, split_dataset
from domain.values import InvalidValue


class SpecRefused(Exception):
    """A spec this owner may not submit, or that names what is not there; the message says
    why and what to do."""

    def __init__(
        self, status: int, slug: str, title: str, detail: str, field: str | None = None
    ) -> None:
        super().__init__(detail)
        self.status, self.slug, self.title, self.detail, self.field = (
            status, slug, title, detail, field,
        )  # fmt: skip


class JobSpecs:
    """The specs recorded for one owner's submitted jobs. A checkpoint or a set of datasets
    that many jobs of a list name is looked up once, and so is whether the owner may use
    priority high."""

    def __init__(self, services: Services, owner: str) -> None:
        self.services, self.owner = services, owner
        self.checkpoints: dict[str, str] = {}
        self.datasets: dict[tuple[str, ...], dict[str, str]] = {}
        self.high_priority: bool | None = None
        self.runtimes: dict[str, Runtime | None] = {}

    def recorded(self, asked: JobSpec) -> JobSpec:
        """The spec to record for a job whose body asks for ``asked`` (its datasets as given:
        ``NAME`` or ``NAME=MOUNT``)."""
        settings = self.services.settings
        if asked.priority == "high" and not self._may_use_high_priority():
            raise SpecRefused(
                403, "high-priority-not-granted", "High priority not granted",
                f"{self.owner} may not submit priority high jobs: use --priority normal (or "
                f"low), or ask an admin to run `flexai admin user high-priority {self.owner} "
                "--allow`", "priority",
            )  # fmt: skip
        try:
            check_repository_url(asked.repository_url, allowed=settings.allowed_repo_schemes)
        except InvalidValue as error:
            raise SpecRefused(422, "invalid-request", "Repository URL refused", str(error),
                              "repository_url") from None  # fmt: skip
        spec = replace(
            asked,
            input_checkpoint_id=self._checkpoint(asked.checkpoint) if asked.checkpoint else None,
            time_limit_s=settings.default_time_limit_s if asked.time_limit_s is None
            else asked.time_limit_s,
        )
        spec = self._in_runtime(spec)
        return self._pinned(spec) if spec.datasets else spec

    def _in_runtime(self, spec: JobSpec) -> JobSpec:
        """The runtime's image and registry secret pinned as they are now (the agent gets
        them even if the runtime changes later); none for ``host``, the node's own system."""
        if spec.runtime in (None, HOST_RUNTIME):
            return replace(spec, runtime=None, runtime_image=None, registry_secret=None,
                           registry_secret_owner=None)  # fmt: skip
        if spec.runtime not in self.runtimes:
            self.runtimes[spec.runtime] = self.services.runtimes.get(spec.runtime)
        runtime = self.runtimes[spec.runtime]
        if runtime is None:
            raise SpecRefused(422, "runtime-not-found", "Runtime not found",
                              self._no_runtime(spec.runtime), "runtime")  # fmt: skip
        return replace(spec, runtime_image=runtime.image, registry_secret=runtime.registry_secret,
                       registry_secret_owner=runtime.registry_secret_owner)  # fmt: skip

    def _no_runtime(self, name: str) -> str:
        there = [runtime.name for runtime in self.services.runtimes.listed()]
        if not there:
            return (f"there is no runtime named '{name}', nor any other yet: an admin makes one "
                    "with `flexai admin runtime create NAME --image REF`; or leave out "
                    "--runtime to run on the node's own system")  # fmt: skip
        return (f"there is no runtime named '{name}': use one of {', '.join(there)} "
                f"(`flexai runtime list` shows their images), or {HOST_RUNTIME} for the node's "
                "own system")  # fmt: skip

    def _pinned(self, spec: JobSpec) -> JobSpec:
        """Each dataset pinned to its version now (a name not pushed fails the build), and
        found at ``/input/MOUNT`` where the body gave ``NAME=MOUNT``."""
        pairs = [split_dataset(item) for item in spec.datasets]
        names = tuple(name for name, _ in pairs)
        if names not in self.datasets:
            self.datasets[names] = self.services.queries.dataset_hashes(self.owner, names)
        mounts = {name: mount for name, mount in pairs if mount != name}
        return replace(spec, datasets=names, dataset_mounts=mounts,
                       dataset_hashes=dict(self.datasets[names]))  # fmt: skip

    def _may_use_high_priority(self) -> bool:
        if self.high_priority is None:  # asked once for a whole list
            self.high_priority = self.services.identities.may_use_high_priority(self.owner)
        return self.high_priority

    def _checkpoint(self, wanted: str) -> str:
        if wanted not in self.checkpoints:
            found = self.services.queries.checkpoint(self.owner, wanted)
            if found is None:
                raise SpecRefused(
                    404, "checkpoint-not-found", "Checkpoint not found",
                    f"no checkpoint with id or name '{wanted}'; "
                    "`flexai training checkpoints <job>` lists them",
                )  # fmt: skip
            self.checkpoints[wanted] = found["id"]
        return self.checkpoints[wanted]
