"""A job's image reference, ``docker://HOST[:PORT]/PATH[:TAG|@sha256:HEX]``, parsed once.

A reference without a registry host is Docker Hub's (``python:3.12`` is
``docker.io/library/python:3.12``), as ``docker pull`` reads it; without a tag, ``latest``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
TRANSPORT = "docker://"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?"
)
_NAME = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = re.compile(rf"{_NAME}(?:/{_NAME})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class InvalidReference(ValueError):
    """Not an image reference this node can pull."""


@dataclass(frozen=True)
class ImageReference:
    registry: str
    """``HOST[:PORT]``: who is asked for the image (and whose credentials are given)."""
    path: str
    tag: str | None = None
    digest: str | None = None
    """``sha256:HEX`` when the reference pins one: the image is then that, whatever the tag."""

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.path}"

    def __str__(self) -> str:
        if self.digest:
            return f"{self.name}@{self.digest}"
        return f"{self.name}:{self.tag or 'latest'}"

    def pinned(self, digest: str) -> ImageReference:
        """The same image, by ``digest`` (what a tag named when it was looked up)."""
        return ImageReference(self.registry, self.path, self.tag, digest)

    @property
    def transport(self) -> str:
        """As skopeo takes it (``docker://...``)."""
        return TRANSPORT + str(self)


def parse_reference(text: str) -> ImageReference:
    """``text`` parsed; :class:`InvalidReference` saying what is wrong with it."""
    rest = text.strip()
    if rest.startswith(TRANSPORT):
        rest = rest[len(TRANSPORT) :]
    elif "://" in rest:
        raise InvalidReference(f"{text!r}: only docker:// image references are pulled")
    rest, _, digest = rest.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        raise InvalidReference(f"{text!r}: a digest is sha256: and 64 hexadecimal digits")
    first, slash, after = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        registry, rest = first, after
    else:
        registry = DOCKER_HUB
    tag = None
    head, colon, tail = rest.rpartition(":")
    if colon and "/" not in tail:
        rest, tag = head, tail
        if not _TAG.fullmatch(tag):
            raise InvalidReference(f"{text!r}: {tag!r} is not a tag")
    if not _HOST.fullmatch(registry):
        raise InvalidReference(f"{text!r}: {registry!r} is not a registry's host[:port]")
    if not _PATH.fullmatch(rest):
        raise InvalidReference(
            f"{text!r}: {rest!r} is not an image's path (lowercase names separated by /)"
        )
    if registry == DOCKER_HUB and "/" not in rest:
        rest = f"library/{rest}"
    return ImageReference(registry, rest, tag if tag or digest else "latest", digest or None)
