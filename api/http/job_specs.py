"""What a submitted job's spec records, beyond what its body says: the input checkpoint and
datasets it names pinned to the ids and contents they have now, and the default time limit.
Used by single and list submissions alike (``routes/jobs.py``, ``routes/submissions.py``)."""

from __future__ import annotations

from typing import Any

from api.http.problems import Problem
from api.http.schemas import JobCreate
from api.services import Services
from domain.values import InvalidValue, check_repository_url


class JobSpecs:
    """The specs recorded for one owner's submitted jobs: each checkpoint and dataset pinned
    now, the time limit the server's default where a job sets none. A checkpoint or a set of
    datasets that many jobs of a list name is looked up once."""

    def __init__(self, services: Services, owner: str) -> None:
        self.services, self.owner = services, owner
        self.checkpoints: dict[str, str] = {}
        self.datasets: dict[tuple[str, ...], dict[str, str]] = {}

    def spec(self, body: JobCreate) -> dict[str, Any]:
        settings = self.services.settings
        spec = body.model_dump(exclude={"name"})
        try:
            check_repository_url(body.repository_url, allowed=settings.allowed_repo_schemes)
        except InvalidValue as error:
            raise Problem(422, "invalid-request", "Repository URL refused", str(error),
                          field="repository_url") from None  # fmt: skip
        spec["input_checkpoint_id"] = self._checkpoint(body.checkpoint) if body.checkpoint else None
        if spec.get("time_limit_s") is None:
            spec["time_limit_s"] = settings.default_time_limit_s
        if body.datasets:  # each pinned to its version now; a name not pushed fails the build
            names = tuple(body.datasets)
            if names not in self.datasets:
                self.datasets[names] = self.services.queries.dataset_hashes(self.owner, names)
            spec["dataset_hashes"] = dict(self.datasets[names])
        return spec

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
