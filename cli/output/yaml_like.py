"""The YAML-like view of nested mappings and lists that ``inspect`` commands print."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cli.output.formats import format_scalar


def render_yaml(data: Mapping[str, Any]) -> str:
    """A YAML-like view of nested mappings and lists, for people rather than parsers."""
    return "\n".join(_yaml_lines(data, 0))


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, Mapping | list) and item:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml_lines(item, indent + 2))
            elif isinstance(item, str) and "\n" in item:
                lines.append(f"{pad}{key}: |")
                lines.extend(f"{pad}  {line}" for line in item.splitlines())
            else:
                lines.append(f"{pad}{key}: {format_scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, Mapping) and item:
                nested = _yaml_lines(item, indent + 2)
                lines.append(f"{pad}- {nested[0].lstrip()}")
                lines.extend(nested[1:])
            else:
                lines.append(f"{pad}- {format_scalar(item)}")
    else:
        lines.append(f"{pad}{format_scalar(value)}")
    return lines
