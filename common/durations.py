"""Durations as users write them: ``90s``, ``30m``, ``2h``, ``1d``, a number of seconds, or
several parts as :func:`human_duration` shows them (``1h30m``, ``1d2h``).

Shared by the CLI (``run --time-limit``), the server (``--default-time-limit``, messages) and
the agent (messages), so that a limit reads the same everywhere."""

from __future__ import annotations

import re

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)?\s*", re.IGNORECASE)
_PART = re.compile(r"(\d+)(sec|min|s|m|h|d)", re.IGNORECASE)
_PARTS = re.compile(r"\s*(?:\d+(?:sec|min|s|m|h|d)){2,}\s*", re.IGNORECASE)
_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Whole seconds of ``text``; raises ValueError saying what is accepted."""
    match = _DURATION.fullmatch(text)
    if match is not None:
        seconds = float(match.group(1)) * _SECONDS[(match.group(2) or "s").lower()]
    elif _PARTS.fullmatch(text) and _decreasing(sizes := [
            (int(count), _SECONDS[unit.lower()]) for count, unit in _PART.findall(text)]):
        seconds = sum(count * size for count, size in sizes)
    else:
        raise ValueError(f"{text!r} is not a duration: use e.g. 90s, 30m, 1h30m, 2h or 1d")
    if seconds < 1:
        raise ValueError(f"{text!r} is shorter than one second")
    return round(seconds)


def _decreasing(parts: list[tuple[int, int]]) -> bool:
    """Whether each part's unit is smaller than the one before (``1h30m``, not ``30m1h``)."""
    return all(later[1] < earlier[1] for earlier, later in zip(parts, parts[1:], strict=False))


def human_duration(seconds: float) -> str:
    """``5400`` -> ``1h30m``; ``90`` -> ``1m30s``; ``45`` -> ``45s``."""
    total = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
