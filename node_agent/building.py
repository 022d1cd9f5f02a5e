"""The build stage of one job on this node, before the control plane's go: processes an earlier
build left ended, fresh folders, the build's log opened, the job's image pulled (or found in
this node's cache: :mod:`node_agent.images`) when its spec names one, the build run
(:mod:`node_agent.build`) and its failure reported; and, after a preemption, each later
attempt's own folders, log and input checkpoint (:mod:`node_agent.build.attempts`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from node_agent.build.attempts import prepare_attempt
from node_agent.build.builder import (
    BuildCaches,
    BuildCancelled,
    BuildFailed,
    BuiltJob,
    CheckpointMissing,
    JobBuild,
)
from node_agent.build.datasets import DatasetCache
from node_agent.build.secrets import JobSecrets, fetch_secrets
from node_agent.build.unpack import ArchiveRefused
from node_agent.client import ApiError, ApiUnavailable, ArtifactAltered, ControlPlaneClient
from node_agent.images.ensure import Image, ImageSettings, PullCancelled, ensure_image
from node_agent.images.pull import ImagePullFailed, RegistryCredentials
from node_agent.jobstate import JobState
from node_agent.models import Assignment
from node_agent.reports import JobReporter
from node_agent.run.processes import end_processes, job_processes
from node_agent.running import ABORT_GRACE
from node_agent.shipping import JobShipping

log = logging.getLogger("flexai.agent")


class BuildStage:
    """Builds one job, and each attempt after a preemption; a stop during a build is reported
    ``stopped``, a failure ``build_failed`` (or ``failed``, for a later attempt)."""

    def __init__(
        self,
        job: JobState,
        client: ControlPlaneClient,
        shipping: JobShipping,
        reporter: JobReporter,
        *,
        work_dir: Path,
        datasets_dir: Path | None,
        python: str,
        site_packages: bool,
        asked: float,
        images: ImageSettings | None = None,
    ) -> None:
        self.job = job
        self.client = client
        self.shipping = shipping
        self.reporter = reporter
        self.work_dir = work_dir
        self.datasets_dir = datasets_dir
        self.python = python
        """The interpreter the job's virtual environment is made from."""
        self.site_packages = site_packages
        self.asked = asked
        """When this node took the job (``time.monotonic``)."""
        self.images = images or ImageSettings()

    def end_earlier_processes(self) -> None:
        """Processes of an earlier build of this job, left by an agent that restarted."""
        dirs = self.job.dirs
        if not dirs.root.exists():
            return  # no build of the job began on this node: nothing of it can run here
        if earlier := job_processes(dirs.marker):
            log.warning(
                "job %s: ending processes %s of an earlier build of it",
                self.job.job_id,
                ", ".join(map(str, earlier)),
            )
            end_processes(lambda: job_processes(dirs.marker), ABORT_GRACE)

    def open_log(self, secrets: JobSecrets) -> None:
        """A new log; or, built again after the agent restarted, the log the control plane
        holds the start of: appended to, so every byte it holds stays the node's."""
        log_file = self.job.dirs.log_file
        if log_file.exists():
            try:
                self.shipping.open_logs(resume=True, secret_values=secrets.masked)
            except OSError as error:
                log.error("job %s: its log is started anew: %s", self.job.job_id, error)
                log_file.unlink(missing_ok=True)  # not truncated: it may be a link
            else:
                self.shipping.say("[agent] the node agent restarted before the job started; "
                                  "building it again")  # fmt: skip
                return
        self.shipping.open_logs(resume=False, secret_values=secrets.masked)

    def build(self, secrets: JobSecrets) -> BuiltJob | None:
        """The job built in its folders; None when it was stopped or failed (reported)."""
        job = self.job
        name, spec = job.assignment.name, job.assignment.spec
        log.info("job %s (%s): building from %s", job.job_id, name, spec.repository_url)
        build = JobBuild(
            spec,
            job.dirs,
            log=lambda line: self.shipping.say(f"[build] {line}"),
            cancel=job.stopping,
            datasets_dir=self.datasets_dir,
            dataset_cache=DatasetCache.for_job(self.client, job.job_id, self.work_dir),
            input_checkpoint_id=job.assignment.input_checkpoint_id,
            fetch_checkpoint=self._fetch_checkpoint,
            as_user=job.confinement.user,
            python=self.python,
            site_packages=self.site_packages,
            caches=BuildCaches.in_work_dir(self.work_dir),
            asked=self.asked,
            secrets=secrets,
        )
        try:
            if job.stopping.is_set():
                raise BuildCancelled()
            build.require_secrets()
            image = self.pull_image()
            built = build.run()
            return replace(built, image_digest=image.digest) if image else built
        except BuildCancelled:
            self.shipping.stopped_before_running()
        except BuildFailed as failure:
            log.info("job %s: build failed (%s): %s", job.job_id, failure.code, failure.message)
            self.shipping.say(f"[build] failed: {failure.message}")
            self.shipping.ship_logs()
            answer = self.reporter.build_failed(failure.code, failure.message, failure.commit)
            self.shipping.stopped_if_refused(answer)
        return None

    def pull_image(self) -> Image | None:
        """The image the job's spec names, on this node (before its repository: a pull that
        fails fails the build early); None when it names none."""
        reference = self.job.assignment.spec.runtime_image
        if not reference:
            return None
        try:
            return ensure_image(
                reference,
                self._registry_credentials(),
                cache=self.images.cache(self.work_dir),
                insecure_registries=self.images.insecure_registries,
                log=lambda line: self.shipping.say(f"[build] {line}"),
                cancel=self.job.stopping,
            )
        except ImagePullFailed as failure:
            raise BuildFailed(IMAGE_PULL_FAILED, failure.message) from None
        except PullCancelled:
            raise BuildCancelled() from None

    def _registry_credentials(self) -> RegistryCredentials | None:
        """The login of the registry the job's runtime names a secret for (asked of the
        control plane while the job builds); None: the image is pulled anonymously."""
        assignment = self.job.assignment
        name = assignment.spec.registry_secret
        if not name:
            return None
        try:
            job_id, node_index = assignment.job_id, assignment.node_index
            username, password = self.client.registry_credentials(job_id, node_index)
        except (ApiError, ApiUnavailable) as error:
            raise BuildFailed(IMAGE_PULL_FAILED, f"the login of the runtime's registry (secret "
                              f"{name!r}) is not available: {error}") from None  # fmt: skip
        try:
            return RegistryCredentials.from_secret(f"{username}:{password}")
        except ValueError as error:
            raise BuildFailed(IMAGE_PULL_FAILED, f"the registry secret {name!r}: {error}") from None

    def prepare_attempt(self, go: Assignment) -> tuple[tuple[str, ...], JobSecrets] | None:
        """The new attempt's log, folders and input checkpoint; its command line and secrets,
        or None when it cannot run (said in its log, and reported)."""
        job, say = self.job, self.shipping.say
        secrets = fetch_secrets(self.client, go)
        checkpoint = go.input_checkpoint_id
        try:
            job.dirs.create_attempt()
            self.shipping.open_logs(resume=False, secret_values=secrets.masked)
            say(f"[agent] attempt {job.attempt} of the job: running again from "
                f"{f'checkpoint {checkpoint}' if checkpoint else 'its start'}")  # fmt: skip
            argv = prepare_attempt(job.dirs, go, secrets=secrets,
                                   fetch_checkpoint=self._fetch_checkpoint, log=say,
                                   cancel=job.stopping, as_user=job.confinement.user,
                                   python=self.python)  # fmt: skip
            return argv, secrets
        except BuildFailed as failure:
            log.info("job %s: attempt %d cannot run: %s", job.job_id, job.attempt,
                     failure.message)  # fmt: skip
            self.shipping.failed(failure.code, failure.message, started=True)
        except OSError as error:
            self.shipping.failed("node_lost", f"the job's folders cannot be made: {error}",
                                 started=True)  # fmt: skip
        return None

    def _fetch_checkpoint(self, checkpoint_id: str, destination: Path) -> None:
        try:
            self.client.download_checkpoint(checkpoint_id, destination)
        except ArtifactAltered as error:
            raise ArchiveRefused(str(error)) from None
        except ApiError as error:
            raise CheckpointMissing(str(error)) from None


IMAGE_PULL_FAILED = "image_pull_failed"
