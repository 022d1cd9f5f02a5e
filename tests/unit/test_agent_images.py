"""The node's container images: references, what skopeo's errors say, the credentials kept off
every command line, and the cache (its index, its size bound, two jobs pulling one image)."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import pytest

from node_agent.build.filelock import FileLock
from node_agent.images.cache import ImageCache, remove
from node_agent.images.ensure import parse_size
from node_agent.images.flags import add_flags, image_settings
from node_agent.images.pull import RegistryCredentials, classify, skopeo_for, unpack_argv
from node_agent.images.reference import InvalidReference, parse_reference

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "registry", "path", "tag", "digest"),
    [
        ("docker://127.0.0.1:5000/test/img:1", "127.0.0.1:5000", "test/img", "1", None),
        ("registry.example.com/team/train", "registry.example.com", "team/train", "latest", None),
        ("python:3.12", "docker.io", "library/python", "3.12", None),
        ("nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io", "nvidia/pytorch", "24.01-py3", None),
        (f"localhost/img@{DIGEST}", "localhost", "img", None, DIGEST),
        (f"docker://ghcr.io/o/r:v1@{DIGEST}", "ghcr.io", "o/r", "v1", DIGEST),
    ],
)
def test_an_image_reference_names_its_registry_path_tag_and_digest(
    text: str, registry: str, path: str, tag: str | None, digest: str | None
) -> None:
    parsed = parse_reference(text)
    assert (parsed.registry, parsed.path, parsed.tag, parsed.digest) == (
        registry, path, tag, digest)  # fmt: skip
    assert parsed.transport.startswith(f"docker://{registry}/{path}")


@pytest.mark.parametrize(
    "text",
    ["", "oci:/tmp/layout:1", "docker://host:5000/UPPER/case", "host.io/img:bad tag",
     "host.io/img@sha256:short", "docker://host.io/../etc", "-rf/img"],
)  # fmt: skip
def test_a_reference_that_is_no_image_is_refused(text: str) -> None:
    with pytest.raises(InvalidReference):
        parse_reference(text)


def test_a_pinned_reference_is_pulled_by_its_digest() -> None:
    parsed = parse_reference("docker://127.0.0.1:5000/test/img:1").pinned(DIGEST)
    assert parsed.transport == f"docker://127.0.0.1:5000/test/img@{DIGEST}"


SKOPEO_SAID = {
    "unauthorized": 'time="x" level=fatal msg="Error parsing image name \\"docker://r:5000/'
    'test/img:1\\": reading manifest 1 in r:5000/test/img: unauthorized: authentication '
    'required"',
    "not found": 'time="x" level=fatal msg="initializing source docker://r:5000/test/img:7: '
    'reading manifest 7 in r:5000/test/img: manifest unknown: manifest unknown"',
    "unreachable": 'time="x" level=fatal msg="Error parsing image name \\"docker://127.0.0.1:1/'
    't/i:1\\": pinging container registry 127.0.0.1:1: Get \\"http://127.0.0.1:1/v2/\\": dial '
    'tcp 127.0.0.1:1: connect: connection refused"',
    "unreachable ": 'level=fatal msg="pinging container registry 127.0.0.1:40404: Get '
    '\\"http://127.0.0.1:40404/v2/\\": dial tcp 127.0.0.1:40404: connect: connection refused"',
    "TLS": 'level=fatal msg="pinging container registry r:5000: Get \\"https://r:5000/v2/\\": '
    'http: server gave HTTP response to HTTPS client"',
}


@pytest.mark.parametrize("reason", sorted(SKOPEO_SAID))
def test_what_the_registry_answered_is_read_from_skopeos_errors(reason: str) -> None:
    found, detail, advice = classify(SKOPEO_SAID[reason])
    assert found == reason.strip()  # "unreachable ": a port that reads 404 is no 404
    assert "level=fatal" not in detail and "Error parsing image name" not in detail
    assert advice


def test_docker_hubs_denied_is_unauthorized_and_an_unknown_error_says_failed() -> None:
    denied = 'msg="reading manifest 1 in docker.io/x/y: denied: requested access to the ' \
        'resource is denied"'  # fmt: skip
    assert classify(denied)[0] == "unauthorized"
    assert classify("skopeo: something else entirely")[:2] == (
        "failed", "skopeo: something else entirely")  # fmt: skip


def test_a_registry_secret_is_user_colon_password_and_its_password_is_never_shown() -> None:
    credentials = RegistryCredentials.from_secret("robot$ci:tok:en")
    assert (credentials.username, credentials.password) == ("robot$ci", "tok:en")
    assert "tok:en" not in repr(credentials)
    with pytest.raises(ValueError):
        RegistryCredentials.from_secret("no-password")


def test_no_credential_is_on_skopeos_command_line_but_in_a_private_auth_file() -> None:
    reference = parse_reference("docker://127.0.0.1:5000/test/img:1")
    credentials = RegistryCredentials("user", "hunter2-password")
    with skopeo_for(reference, credentials, insecure=False) as skopeo:
        argvs = [skopeo.inspect_argv(reference), skopeo.copy_argv(reference, Path("/l"))]
        auth = skopeo.home / "auth.json"
        assert auth.stat().st_mode & 0o777 == 0o600
        assert skopeo.home.stat().st_mode & 0o777 == 0o700
        assert "hunter2-password" not in auth.read_text()  # base64, as docker writes it
        assert list(json.loads(auth.read_text())["auths"]) == ["127.0.0.1:5000"]
        environment = " ".join(skopeo.env.values())
    for argv in argvs:
        joined = " ".join(argv)
        assert "hunter2" not in joined and "user" not in joined.replace(str(skopeo.home), "")
        assert any(arg.endswith("tls-verify=true") for arg in argv)
        assert not any("creds" in arg for arg in argv)
    assert "hunter2" not in environment
    assert not skopeo.home.exists()


def test_a_pull_without_credentials_is_anonymous_and_an_insecure_registry_plain_http() -> None:
    reference = parse_reference("docker://10.0.0.5:5000/test/img:1")
    with skopeo_for(reference, None, insecure=True) as skopeo:
        copy = skopeo.copy_argv(reference, Path("/l"))
        assert not (skopeo.home / "auth.json").exists()
    assert "--src-no-creds" in copy and "--src-tls-verify=false" in copy
    assert unpack_argv(Path("/c/l"), Path("/c/b"), rootless=True)[2] == "--rootless"


def test_sizes_and_insecure_registries_are_read_as_the_agent_takes_them() -> None:
    assert parse_size("20G") == 20 * 2**30
    assert parse_size("512m") == 512 * 2**20 and parse_size("1.5T") == int(1.5 * 2**40)
    assert parse_size("1000") == 1000
    with pytest.raises(ValueError):
        parse_size("lots")
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_flags(parser)
    settings = image_settings(parser.parse_args(
        ["--image-cache-size", "20G", "--insecure-registry", "10.0.0.5:5000",
         "--insecure-registry", "registry.lan"]))  # fmt: skip
    assert settings.cache_size == 20 * 2**30
    assert settings.insecure_registries == {"10.0.0.5:5000", "registry.lan"}
    assert image_settings(parser.parse_args([])).cache_size == 50 * 2**30
    for wrong in (["--insecure-registry", "http://x:5000"], ["--image-cache-size", "big"]):
        with pytest.raises(argparse.ArgumentError):
            parser.parse_args(wrong)


# -- the cache ---------------------------------------------------------------------------------


def digest(n: int) -> str:
    return f"sha256:{n:064x}"


def filler(size: int, calls: list[str], delay: float = 0.0):  # type: ignore[no-untyped-def]
    def fill(staging: Path) -> bool:
        calls.append(staging.name)
        time.sleep(delay)
        (staging / "rootfs" / "etc").mkdir(parents=True)
        (staging / "rootfs" / "etc" / "data").write_bytes(b"x" * size)
        (staging / "rootfs" / "etc" / "data").chmod(0o666)
        return True

    return fill


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def test_an_image_is_unpacked_once_read_only_and_recorded_in_the_index(tmp_path: Path) -> None:
    cache, calls = ImageCache(tmp_path, 10 * 2**20), []
    rootfs = cache.ensure(digest(1), "r/a:1", filler(4096, calls), threading.Event())
    again = cache.ensure(digest(1), "r/a:1", filler(4096, calls), threading.Event())
    assert rootfs == again == tmp_path / f"{1:064x}" / "rootfs"
    assert len(calls) == 1
    assert (rootfs / "etc" / "data").stat().st_mode & 0o777 == 0o644
    index = json.loads((tmp_path / "index.json").read_text())
    assert index[digest(1)]["size"] >= 4096 and index[digest(1)]["reference"] == "r/a:1"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".staging")] == []


def test_the_least_recently_used_images_are_evicted_past_the_size_bound(tmp_path: Path) -> None:
    cache, calls = ImageCache(tmp_path, 250_000, clock=Clock()), []
    for n in (1, 2):
        cache.ensure(digest(n), f"r/{n}", filler(100_000, calls), threading.Event())
    cache.ensure(digest(1), "r/1", filler(100_000, calls), threading.Event())  # 1 used again
    cache.ensure(digest(3), "r/3", filler(100_000, calls), threading.Event())
    assert set(cache.entries()) == {digest(1), digest(3)}
    assert not cache.folder(digest(2)).exists()
    assert set(json.loads((tmp_path / "index.json").read_text())) == {digest(1), digest(3)}


def test_an_image_a_job_holds_is_not_evicted_and_one_too_big_is_kept(tmp_path: Path) -> None:
    cache, calls = ImageCache(tmp_path, 150_000, clock=Clock()), []
    cache.ensure(digest(1), "r/1", filler(100_000, calls), threading.Event())
    with cache.hold(digest(1)):
        cache.ensure(digest(2), "r/2", filler(100_000, calls), threading.Event())
        assert set(cache.entries()) == {digest(1), digest(2)}
    assert cache.evict() == [digest(1)]
    cache.ensure(digest(3), "r/3", filler(400_000, calls), threading.Event())
    assert set(cache.entries()) == {digest(3)}


def test_two_jobs_ensuring_one_image_at_once_pull_it_once(tmp_path: Path) -> None:
    cache, calls = ImageCache(tmp_path, 10 * 2**20), []
    found: list[Path | None] = []

    def ensure() -> None:
        found.append(cache.ensure(digest(7), "r/7", filler(10, calls, 0.3), threading.Event()))

    threads = [threading.Thread(target=ensure) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert found == [cache.folder(digest(7)) / "rootfs"] * 3


def test_a_half_unpacked_image_a_crash_left_is_unpacked_again(tmp_path: Path) -> None:
    cache, calls = ImageCache(tmp_path, 10 * 2**20), []
    stale = tmp_path / f".staging-{5:064x}-crashed"
    (stale / "rootfs").mkdir(parents=True)
    (tmp_path / "index.json").write_text("{not json")
    rootfs = cache.ensure(digest(5), "r/5", filler(10, calls), threading.Event())
    assert calls and (rootfs / "etc" / "data").is_file()
    assert not stale.exists()
    assert set(cache.entries()) == {digest(5)}


def test_a_pull_stopped_midway_leaves_nothing_in_the_cache(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path, 10 * 2**20)
    assert cache.ensure(digest(6), "r/6", lambda staging: False, threading.Event()) is None
    assert not cache.folder(digest(6)).exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".staging")] == []


def test_the_images_held_are_read_from_the_index_without_those_gone_or_of_unknown_reference(
    tmp_path: Path,
) -> None:
    cache, calls = ImageCache(tmp_path, 10 * 2**20), []
    assert cache.held() == []
    for n in (2, 1, 3):
        cache.ensure(digest(n), f"r.io/{n}:x", filler(10, calls), threading.Event())
    (tmp_path / f"{9:064x}").mkdir()  # a folder the index lost: its reference is unknown
    remove(cache.folder(digest(3)))  # removed, the index not yet rewritten
    with cache.hold(digest(1)), FileLock(tmp_path / ".locks" / "index.lock", threading.Event()):
        assert cache.held() == [("r.io/1:x", digest(1)), ("r.io/2:x", digest(2))]
