"""An image on this node: looked up in the registry (its manifest's digest), taken from the
node's cache, else pulled and unpacked into it.

The pull's progress goes to ``log`` (the job's build log); credentials never do.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from node_agent.build.filelock import LockCancelled
from node_agent.images.cache import ImageCache, remove
from node_agent.images.pull import (
    ImagePullFailed,
    RegistryCredentials,
    copy_image,
    manifest_digest,
    skopeo_for,
    unpack_image,
)
from node_agent.images.reference import InvalidReference, parse_reference

DEFAULT_CACHE_SIZE = 50 * 2**30
"""``flexai agent --image-cache-size``: room for a few CUDA images."""
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class PullCancelled(Exception):
    """The job was stopped while its image was pulled (or waited for)."""


@dataclass(frozen=True)
class Image:
    reference: str
    digest: str
    """``sha256:HEX``: the manifest's, what the reference named when it was pulled."""
    rootfs: Path
    """Read-only to jobs: the node's cached copy, shared by every job of the image."""


@dataclass(frozen=True)
class ImageSettings:
    """``flexai agent --image-cache-size`` and ``--insecure-registry``."""

    cache_size: int = DEFAULT_CACHE_SIZE
    insecure_registries: frozenset[str] = field(default_factory=frozenset)
    """``HOST:PORT`` of the registries this node may reach over plain HTTP."""

    def cache(self, work_dir: Path) -> ImageCache:
        return ImageCache(work_dir / "images", self.cache_size)


def ensure_image(
    reference: str,
    credentials: RegistryCredentials | None,
    *,
    cache: ImageCache,
    insecure_registries: Collection[str] = (),
    log: Callable[[str], None] = lambda _: None,
    cancel: threading.Event | None = None,
) -> Image:
    """The image ``reference`` names, on this node. Raises :class:`ImagePullFailed` (what the
    registry answered) or :class:`PullCancelled`."""
    cancel = cancel or threading.Event()
    try:
        parsed = parse_reference(reference)
    except InvalidReference as error:
        raise ImagePullFailed(reference, "invalid", f"cannot pull image: {error}") from None
    insecure = parsed.registry in insecure_registries
    with skopeo_for(parsed, credentials, insecure) as skopeo:
        log(f"image {parsed}: asking {parsed.registry} for its digest"
            + (" (plain HTTP: an insecure registry of this node)" if insecure else ""))  # fmt: skip
        digest = manifest_digest(skopeo, parsed)
        pulled = False

        def fill(staging: Path) -> bool:
            nonlocal pulled
            pulled = True
            log(f"image {parsed}: pulling {digest}")
            layout, bundle = staging / "layout", staging / "bundle"
            if not copy_image(skopeo, parsed.pinned(digest), layout, log, cancel):
                return False
            log(f"image {parsed}: unpacking")
            if not unpack_image(layout, bundle, log, cancel):
                return False
            os.rename(bundle / "rootfs", staging / "rootfs")
            os.rename(bundle / "config.json", staging / "config.json")  # its env, for the run
            remove(layout)
            remove(bundle)
            return True

        try:
            rootfs = cache.ensure(digest, str(parsed), fill, cancel)
        except LockCancelled:
            raise PullCancelled() from None
    if rootfs is None:
        raise PullCancelled()
    where = "pulled" if pulled else "in this node's cache"
    log(f"image {parsed}: {where} ({digest})")
    return Image(str(parsed), digest, rootfs)


def parse_size(text: str) -> int:
    """``20G``, ``500M``, ``1.5T`` or bytes -> bytes (powers of 1024)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", text.upper())
    if not match:
        raise ValueError(f"expected a size such as 20G or 500M, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])

