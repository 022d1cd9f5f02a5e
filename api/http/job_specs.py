"""What a submitted job's spec records, beyond what its body says: the input checkpoint and
datasets it names pinned to the ids and contents they have now, and the default time limit;
its sharing fields (priority, preemptible, retries) only where they differ from their defaults,
so that specs written before them read the same. Used by single and list submissions alike
(``routes/jobs.py``, ``routes/submissions.py``)."""

from __future__ import annotations

from typing import Any

from api.http.problems import Problem
from api.http.schemas import JobCreate
from api.services import Services
from common.job_spec import DEFAULT_PRIORITY, default_preemptible
from domain.specs import check_repository_url, split_dataset
from domain.values import InvalidValue


class JobSpecs:
    """The specs recorded for one owner's submitted jobs: each checkpoint and dataset pinned
    now, the time limit the server's default where a job sets none. A checkpoint or a set of
    datasets that many jobs of a list name is looked up once."""

    def __init__(self, services: Services, owner: str) -> None:
        self.services, self.owner = services, owner
        self.checkpoints: dict[str, str] = {}
        self.datasets: dict[tuple[str, ...], dict[str, str]] = {}
        self.high_priority: bool | None = None

    def spec(self, body: JobCreate) -> dict[str, Any]:
        settings = self.services.settings
        spec = body.model_dump(exclude={"name"})
        self._sharing(spec)
        try:
            check_repository_url(body.repository_url, allowed=settings.allowed_repo_schemes)
        except InvalidValue as error:
            raise Problem(422, "invalid-request", "Repository URL refused", str(error),
                          field="repository_url") from None  # fmt: skip
        spec["input_checkpoint_id"] = self._checkpoint(body.checkpoint) if body.checkpoint else None
        if spec.get("time_limit_s") is None:
            spec["time_limit_s"] = settings.default_time_limit_s
        if body.datasets:  # each pinned to its version now; a name not pushed fails the build
            pairs = [split_dataset(item) for item in body.datasets]
            spec["datasets"] = [name for name, _ in pairs]
            mounts = {name: mount for name, mount in pairs if mount != name}
            if mounts:  # NAME=MOUNT: found at /input/MOUNT (stored only where given)
                spec["dataset_mounts"] = mounts
            names = tuple(spec["datasets"])
            if names not in self.datasets:
                self.datasets[names] = self.services.queries.dataset_hashes(self.owner, names)
            spec["dataset_hashes"] = dict(self.datasets[names])
        return spec

    def _sharing(self, spec: dict[str, Any]) -> None:
        """Drop the sharing fields left at their defaults; refuse ``high`` to whom it is not
        granted."""
        priority = spec["priority"]
        if priority == "high" and not self._may_use_high_priority():
            raise Problem(
                403, "high-priority-not-granted", "High priority not granted",
                f"{self.owner} may not submit priority high jobs: use --priority normal (or "
                f"low), or ask an admin to run `flexai admin user high-priority {self.owner} "
                "--allow`",
                field="priority",
            )  # fmt: skip
        defaults = {"priority": DEFAULT_PRIORITY, "preemptible": default_preemptible(priority),
                    "max_retries": 0, "retry_on_exit_codes": []}  # fmt: skip
        for key, default in defaults.items():
            if spec[key] is None or spec[key] == default:
                del spec[key]

    def _may_use_high_priority(self) -> bool:
        if self.high_priority is None:  # asked once for a whole list
            self.high_priority = self.services.identities.may_use_high_priority(self.owner)
        return self.high_priority

    def _checkpoint(self, wanted: str) -> str:
        if wanted not in self.checkpoints:
            found = self.services.queries.checkpoint(self.owner, wanted)
            if found is None:
                raise Problem(
                    404, "checkpoint-not-found", "Checkpoint not found",
                    f"no checkpoint with id or name '{wanted}'; "
                    "`flexai training checkpoints <job>` lists them",
                )  # fmt: skip
            self.checkpoints[wanted] = found["id"]
        return self.checkpoints[wanted]
