"""The node's datasets: each version downloaded once into a read-only cache, checked against its
hash, unpacked safely (no path out of it, no link, no bomb); a name not pushed is looked for in
--datasets-dir, else the build fails with dataset_not_found saying how to push it."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import threading
import time
import zipfile
from pathlib import Path

import pytest

from node_agent.build.datasets import (
    DatasetCache,
    DatasetUnavailable,
    UnpackLimits,
    provide_datasets,
    remove_tree,
    unpack,
)
from node_agent.client import ControlPlaneClient
from node_agent.models import JobSpec
from tests.artifact_plane import ArtifactPlane, serve_plane


def zip_bytes(files: dict[str, bytes], *, links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return buffer.getvalue()


class Plane:
    """The control plane's side: archives by hash; counts the downloads."""

    def __init__(self) -> None:
        self.archives: dict[str, bytes] = {}
        self.downloads = 0
        self.delay = 0.0

    def push(self, files: dict[str, bytes]) -> str:
        data = zip_bytes(files)
        content_hash = hashlib.sha256(data).hexdigest()
        self.archives[content_hash] = data
        return content_hash

    def fetch(self, content_hash: str, destination: Path) -> None:
        self.downloads += 1
        time.sleep(self.delay)
        if content_hash not in self.archives:
            raise DatasetUnavailable("dataset_not_found", "no such version")
        destination.write_bytes(self.archives[content_hash])


@pytest.fixture
def plane() -> Plane:
    return Plane()


@pytest.fixture
def cache(tmp_path: Path, plane: Plane) -> DatasetCache:
    return DatasetCache(tmp_path / "datasets-cache", plane.fetch)


def give(tmp_path: Path, spec: JobSpec, cache: DatasetCache | None,
         local_dir: Path | None = None) -> tuple[Path, list[str]]:  # fmt: skip
    input_dir = tmp_path / "job" / "input"
    input_dir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    provide_datasets(spec, input_dir, log=lines.append, cache=cache, local_dir=local_dir)
    return input_dir, lines


def spec_with(datasets: dict[str, str | None]) -> JobSpec:
    pins = {name: pin for name, pin in datasets.items() if pin is not None}
    return JobSpec(repository_url="/r", entry_point=("train.py",), datasets=tuple(datasets),
                   dataset_hashes=pins)  # fmt: skip


def test_a_pushed_version_is_downloaded_once_then_served_from_the_cache(
    tmp_path: Path, plane: Plane, cache: DatasetCache
) -> None:
    pinned = plane.push({"rows.csv": b"a,b\n", "sub/more.txt": b"more"})
    input_dir, first = give(tmp_path / "one", spec_with({"mnist": pinned}), cache)
    _, second = give(tmp_path / "two", spec_with({"mnist": pinned}), cache)
    assert (input_dir / "mnist" / "rows.csv").read_bytes() == b"a,b\n"
    assert (input_dir / "mnist" / "sub" / "more.txt").read_bytes() == b"more"
    assert plane.downloads == 1
    assert first == [f"dataset mnist: version {pinned[:12]} downloaded into this node's cache"]
    assert second == [f"dataset mnist: version {pinned[:12]} from this node's cache"]


def test_the_cached_version_is_read_only_for_everyone(
    tmp_path: Path, plane: Plane, cache: DatasetCache
) -> None:
    pinned = plane.push({"rows.csv": b"a,b\n", "sub/more.txt": b"more"})
    directory, _ = cache.get(pinned)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode)
             for path in [directory, *directory.rglob("*")]}  # fmt: skip
    assert modes == {pinned: 0o555, "rows.csv": 0o444, "sub": 0o555, "more.txt": 0o444}
    assert stat.S_IMODE(cache.root.stat().st_mode) == 0o711


def test_jobs_needing_the_same_version_at_once_wait_for_one_download(
    plane: Plane, cache: DatasetCache
) -> None:
    pinned = plane.push({"rows.csv": b"a,b\n"})
    plane.delay = 0.3
    found: list[tuple[Path, bool]] = []
    threads = [threading.Thread(target=lambda: found.append(cache.get(pinned)))
               for _ in range(4)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert plane.downloads == 1
    assert sorted(cached for _, cached in found) == [False, True, True, True]
    assert len({path for path, _ in found}) == 1


def test_a_download_that_does_not_match_its_hash_is_not_kept(
    plane: Plane, cache: DatasetCache
) -> None:
    pinned = plane.push({"rows.csv": b"a,b\n"})
    plane.archives[pinned] = zip_bytes({"rows.csv": b"tampered"})
    with pytest.raises(DatasetUnavailable) as refused:
        cache.get(pinned)
    assert refused.value.code == "dataset_invalid" and "does not match" in str(refused.value)
    assert [path.name for path in cache.root.iterdir()] == [f".lock-{pinned}"]


def test_what_an_agent_killed_midway_left_is_cleared_before_the_next_download(
    plane: Plane, cache: DatasetCache
) -> None:
    pinned = plane.push({"rows.csv": b"a,b\n"})
    leftover = cache.root / f".partial-{pinned}-x" / "data" / "sub"
    leftover.mkdir(parents=True)
    leftover.chmod(0o555)
    cache.get(pinned)
    assert not leftover.parent.parent.exists()


@pytest.mark.parametrize(
    ("files", "links", "said"),
    [
        ({"../escape.txt": b"x"}, None, "outside"),
        ({"a/../../escape.txt": b"x"}, None, "outside"),
        ({"/etc/evil": b"x"}, None, "outside"),
        ({"a\\..\\evil": b"x"}, None, "outside"),
        ({}, {"link": "/etc/passwd"}, "link"),
    ],
)
def test_an_archive_reaching_outside_its_directory_or_holding_links_is_refused(
    tmp_path: Path, files: dict[str, bytes], links: dict[str, str] | None, said: str
) -> None:
    archive = tmp_path / "bad.zip"
    archive.write_bytes(zip_bytes(files, links=links))
    with pytest.raises(DatasetUnavailable) as refused:
        unpack(archive, tmp_path / "out", UnpackLimits())
    assert refused.value.code == "dataset_invalid" and said in str(refused.value)
    assert not (tmp_path / "escape.txt").exists()
    assert [path.name for path in (tmp_path / "out").rglob("*")] == []


def test_a_zip_bomb_is_refused_before_a_byte_is_written(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.zip"
    archive.write_bytes(zip_bytes({"zeros.bin": bytes(50 * 2**20)}))
    assert archive.stat().st_size < 2**20
    with pytest.raises(DatasetUnavailable) as refused:
        unpack(archive, tmp_path / "out", UnpackLimits(max_bytes=2**20))
    assert "bytes" in str(refused.value)
    assert list((tmp_path / "out").iterdir()) == []


def test_an_archive_that_writes_more_than_it_declares_is_stopped(tmp_path: Path) -> None:
    data = bytearray(zip_bytes({"a.bin": bytes(4096)}))
    declared = bytes(4096).__len__().to_bytes(4, "little")
    small = (16).to_bytes(4, "little")
    # the central directory's uncompressed size (after the signature PK\x01\x02, at +24)
    central = data.rfind(b"PK\x01\x02")
    assert data[central + 24 : central + 28] == declared
    data[central + 24 : central + 28] = small
    archive = tmp_path / "liar.zip"
    archive.write_bytes(bytes(data))
    with pytest.raises(DatasetUnavailable) as refused:
        unpack(archive, tmp_path / "out", UnpackLimits())
    assert refused.value.code == "dataset_invalid"
    assert sum(path.stat().st_size for path in (tmp_path / "out").rglob("*")) <= 16


def test_too_many_entries_are_refused(tmp_path: Path) -> None:
    archive = tmp_path / "many.zip"
    archive.write_bytes(zip_bytes({f"f{i}": b"" for i in range(20)}))
    with pytest.raises(DatasetUnavailable) as refused:
        unpack(archive, tmp_path / "out", UnpackLimits(max_entries=10))
    assert "20 entries" in str(refused.value)


def test_a_name_not_pushed_is_taken_from_the_datasets_dir(
    tmp_path: Path, cache: DatasetCache
) -> None:
    local = tmp_path / "datasets"
    (local / "tiny").mkdir(parents=True)
    (local / "tiny" / "rows.csv").write_text("x,y")
    input_dir, lines = give(tmp_path, spec_with({"tiny": None}), cache, local)
    assert (input_dir / "tiny" / "rows.csv").read_text() == "x,y"
    assert lines == [f"dataset tiny mounted from {local / 'tiny'}"]


def test_a_name_neither_pushed_nor_on_the_node_says_how_to_push_it(
    tmp_path: Path, cache: DatasetCache
) -> None:
    (tmp_path / "datasets").mkdir()
    with pytest.raises(DatasetUnavailable) as refused:
        give(tmp_path, spec_with({"imagenet": None}), cache, tmp_path / "datasets")
    assert refused.value.code == "dataset_not_found"
    assert "'imagenet'" in str(refused.value)
    assert "flexai dataset push imagenet PATH" in str(refused.value)


def test_a_version_gone_from_the_control_plane_fails_with_dataset_not_found(
    tmp_path: Path, cache: DatasetCache
) -> None:
    with pytest.raises(DatasetUnavailable) as refused:
        give(tmp_path, spec_with({"mnist": "c" * 64}), cache)
    assert refused.value.code == "dataset_not_found"


def test_a_hostile_name_or_hash_never_becomes_a_path(tmp_path: Path, cache: DatasetCache) -> None:
    with pytest.raises(DatasetUnavailable):
        give(tmp_path, spec_with({"../../etc": None}), cache, tmp_path)
    with pytest.raises(DatasetUnavailable):
        cache.get("../" + "a" * 61)
    assert not (tmp_path / "job" / "etc").exists()


def test_removing_a_partial_tree_copes_with_read_only_directories(tmp_path: Path) -> None:
    top = tmp_path / "partial"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_text("x")
    for path in (top / "a" / "b", top / "a"):
        path.chmod(0o555)
    remove_tree(top)
    assert not top.exists()


def test_a_version_downloaded_from_the_store_is_verified_on_the_way_and_kept_only_whole(
    tmp_path: Path,
) -> None:
    weights = os.urandom(2 * 2**20)  # enough for bytes to arrive before the cut
    archive = zip_bytes({"rows.csv": b"a,b\n", "weights.bin": weights})
    pinned = hashlib.sha256(archive).hexdigest()
    path = f"/v1/agent/jobs/job-1/datasets/{pinned}"
    plane = ArtifactPlane(objects={path: archive}, recorded_sha={path: pinned}, redirect=True,
                          cut_downloads=1)  # fmt: skip
    server = serve_plane(plane)
    client = ControlPlaneClient(plane.url, plane.token, retry_for=5.0)
    try:
        cache = DatasetCache.for_job(client, "job-1", tmp_path)
        directory, cached = cache.get(pinned)
        assert (directory / "weights.bin").read_bytes() == weights and not cached
        assert plane.ranges  # resumed after the cut, from the store, without the token

        tampered = zip_bytes({"rows.csv": b"tampered"})
        other = "0" * 64
        plane.objects[f"/v1/agent/jobs/job-1/datasets/{other}"] = tampered
        plane.recorded_sha[f"/v1/agent/jobs/job-1/datasets/{other}"] = other
        with pytest.raises(DatasetUnavailable) as refused:
            cache.get(other)
    finally:
        client.close()
        server.shutdown()
    assert refused.value.code == "dataset_invalid" and other in str(refused.value)
    assert not (tmp_path / "datasets-cache" / other).exists()


def test_a_dataset_listed_twice_by_an_older_job_is_given_once(
    tmp_path: Path, plane: Plane, cache: DatasetCache
) -> None:
    pinned = plane.push({"rows.csv": b"a,b\n"})
    spec = JobSpec(repository_url="/r", entry_point=("train.py",), datasets=("mnist", "mnist"),
                   dataset_hashes={"mnist": pinned})  # fmt: skip
    input_dir, lines = give(tmp_path, spec, cache)
    assert (input_dir / "mnist" / "rows.csv").read_bytes() == b"a,b\n"
    assert len(lines) == 1
