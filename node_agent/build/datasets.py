"""The datasets a job asks for (``--dataset NAME``), each at ``$FLEXAI_INPUT_DIR/NAME``.

A dataset pushed to the control plane comes in the version the job was submitted with: its
content hash (the SHA-256 of its archive) is in the job's spec. This node downloads each
version once, into ``<work-dir>/datasets-cache/<hash>/``, and every job that needs it gets a
symbolic link to that directory. Read-only: the cache is the agent's, its directories mode
0555 and its files 0444, so a job reads them and cannot change them, whichever user it runs
as (a read-only bind mount would need privileges the agent may not have). A name that was not
pushed when the job was submitted is looked for in the node's ``--datasets-dir``.

Each version is downloaded into a temporary directory of the cache, checked against its hash,
unpacked there (plain files and directories only, every name inside it, within limits), then
renamed into place; a lock per hash makes jobs that need the same version wait for one
download rather than race.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from common.contract import DATASET_NAME
from node_agent.build.unpack import ArchiveRefused, NoSpace, UnpackLimits
from node_agent.build.unpack import unpack as safe_unpack
from node_agent.client import ApiError, ApiUnavailable, ArtifactAltered, ControlPlaneClient
from node_agent.models import JobSpec

FetchDataset = Callable[[str, Path], None]
"""Save the archive of the dataset version with the given hash at the path; raise
:class:`DatasetUnavailable` when the control plane does not have it."""

CONTENT_HASH = re.compile(r"[0-9a-f]{64}")
_CHUNK = 2**20


class DatasetUnavailable(Exception):
    """A dataset the job asks for cannot be given to it; ``code`` is the build failure's."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class UnsafeArchive(DatasetUnavailable):
    def __init__(self, message: str) -> None:
        super().__init__("dataset_invalid", message)


class DatasetCache:
    """``<work-dir>/datasets-cache``: one read-only directory per dataset version."""

    def __init__(self, root: Path, fetch: FetchDataset, limits: UnpackLimits | None = None) -> None:
        self.root = root
        self.fetch = fetch
        self.limits = limits or UnpackLimits()

    @classmethod
    def for_job(cls, client: ControlPlaneClient, job_id: str, work_dir: Path) -> DatasetCache:
        """The node's cache, which downloads the versions ``job_id`` was given."""

        def fetch(content_hash: str, destination: Path) -> None:
            try:
                client.download_dataset(job_id, content_hash, destination)
            except ArtifactAltered as error:
                raise UnsafeArchive(str(error.problem.get("detail"))) from None
            except ApiError as error:
                said = error.problem.get("detail") or str(error)
                raise DatasetUnavailable("dataset_not_found", str(said)) from None
            except ApiUnavailable as error:
                raise DatasetUnavailable(
                    "dataset_unavailable", f"the dataset could not be downloaded: {error}"
                ) from None

        return cls(work_dir / "datasets-cache", fetch)

    def get(self, content_hash: str) -> tuple[Path, bool]:
        """The directory holding the version, and whether this node had it already."""
        if not CONTENT_HASH.fullmatch(content_hash):
            raise UnsafeArchive(f"{content_hash[:80]!r} is not a dataset version's hash")
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)  # jobs of another user pass through to a version's directory
        target = self.root / content_hash
        with self._locked(content_hash):
            if target.is_dir():
                return target, True
            self._download(content_hash, target)
        return target, False

    @contextmanager
    def _locked(self, content_hash: str) -> Iterator[None]:
        fd = os.open(self.root / f".lock-{content_hash}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # each open is its own lock: threads wait too
            yield
        finally:
            os.close(fd)

    def _download(self, content_hash: str, target: Path) -> None:
        for stale in self.root.glob(f".partial-{content_hash}-*"):  # an agent killed midway
            remove_tree(stale)
        work = Path(tempfile.mkdtemp(prefix=f".partial-{content_hash}-", dir=self.root))
        try:
            archive = work / "archive.zip"
            self.fetch(content_hash, archive)
            if sha256_of(archive) != content_hash:
                raise UnsafeArchive(
                    f"the archive downloaded for dataset version {content_hash[:12]} does not "
                    "match its hash; run the job again"
                )
            unpacked = work / "data"
            unpack(archive, unpacked, self.limits)
            archive.unlink()
            make_read_only(unpacked)
            unpacked.rename(target)
        finally:
            remove_tree(work)


def provide_datasets(
    spec: JobSpec,
    input_dir: Path,
    *,
    log: Callable[[str], None],
    cache: DatasetCache | None,
    local_dir: Path | None,
) -> None:
    """Give the job each of its datasets at ``input_dir/NAME`` (``input_dir/MOUNT`` for one
    given as ``NAME=MOUNT``; once: a job submitted before the control plane refused a name
    given twice may hold one twice)."""
    for name in dict.fromkeys(spec.datasets):
        if not DATASET_NAME.fullmatch(name):
            raise DatasetUnavailable("dataset_not_found", f"{name[:80]!r} is no dataset name")
        content_hash = spec.dataset_hashes.get(name)
        if content_hash is not None and cache is not None:
            source, cached = cache.get(content_hash)
            where = "from this node's cache" if cached else "downloaded into this node's cache"
            log(f"dataset {name}: version {content_hash[:12]} {where}")
        else:
            source = _local(name, local_dir)
            log(f"dataset {name} mounted from {source}")
        mount = spec.dataset_mounts.get(name, name)
        if not DATASET_NAME.fullmatch(mount):
            raise DatasetUnavailable("dataset_not_found", f"{mount[:80]!r} is no folder name")
        (input_dir / mount).symlink_to(source, target_is_directory=True)


def _local(name: str, local_dir: Path | None) -> Path:
    if local_dir is not None and (local_dir / name).is_dir():
        return (local_dir / name).resolve()
    place = f"in {local_dir}" if local_dir is not None else "(it has no datasets directory)"
    raise DatasetUnavailable(
        "dataset_not_found",
        f"dataset '{name}' had not been pushed when the job was submitted, and this node has no "
        f"copy of it {place}; push it with `flexai dataset push {name} PATH`, then run the "
        "job again (or start the agent with --datasets-dir pointing at a directory that "
        "holds it)",
    )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def unpack(archive: Path, destination: Path, limits: UnpackLimits) -> None:
    """Unpack into the new directory ``destination``: plain files and directories only, each
    inside it, no more entries and bytes than the limits (nor than the archive declares)."""
    if destination.exists():
        raise UnsafeArchive(f"{destination} exists already; the dataset goes into a new one")
    try:
        safe_unpack(archive, destination, limits, "the dataset")
    except NoSpace as error:
        raise DatasetUnavailable(
            "dataset_unavailable",
            f"{error}; an operator must free space (old versions lie in the agent's "
            "datasets-cache directory)",
        ) from None
    except ArchiveRefused as error:
        raise UnsafeArchive(str(error)) from None


def make_read_only(top: Path) -> None:
    """Files 0444 and directories 0555, the top one included: every user reads, none writes."""
    for folder, subfolders, files in os.walk(top, topdown=False):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
        for name in subfolders:
            os.chmod(os.path.join(folder, name), 0o555)
    top.chmod(0o555)


def remove_tree(top: Path) -> None:
    """Remove a directory that may hold read-only directories (a partial download's)."""
    if not top.exists():
        return
    for folder, _, _ in os.walk(top):
        os.chmod(folder, 0o700)
    shutil.rmtree(top, ignore_errors=True)
