"""``flexai agent``'s image flags: the cache's size and the registries reached over plain HTTP."""

from __future__ import annotations

import argparse

from node_agent.images.ensure import DEFAULT_CACHE_SIZE, ImageSettings, parse_size
from node_agent.images.reference import InvalidReference, parse_reference


def add_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--image-cache-size", type=_size, default=DEFAULT_CACHE_SIZE, metavar="SIZE",
        help="room for the unpacked container images jobs run in, e.g. 20G; past it the least "
             "recently used are removed (50G)")  # fmt: skip
    add("--insecure-registry", type=_registry, action="append", default=[],
        metavar="HOST:PORT",
        help="a registry to pull images from over plain HTTP (a private network's); "
             "repeatable. Every other registry is reached over TLS")  # fmt: skip


def image_settings(args: argparse.Namespace) -> ImageSettings:
    return ImageSettings(args.image_cache_size, frozenset(args.insecure_registry))


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _registry(text: str) -> str:
    """``HOST:PORT`` (or ``HOST``), as image references name a registry."""
    try:
        parsed = parse_reference(f"docker://{text}/x")
    except InvalidReference:
        parsed = None
    if parsed is None or parsed.registry != text:
        raise argparse.ArgumentTypeError(f"expected a registry's HOST:PORT, got {text!r}")
    return text
