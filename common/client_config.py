"""The client configuration: where the API is and which token to send.

Shared by the CLI, the agent (when it is given no ``--token``) and the server (which writes it
on start so the CLI on that machine works at once).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


class ConfigError(Exception):
    """The client configuration is missing or unreadable."""


@dataclass(frozen=True)
class ClientConfig:
    api_url: str
    token: str
    ca_file: str | None = None
    """A private CA's certificate (or the server's own) to verify the server with, besides the
    system's CAs (``FLEXAI_CA_FILE`` wins over it)."""


def config_path() -> Path:
    """The config file: ``$FLEXAI_CONFIG``, else the XDG config home."""
    explicit = os.environ.get("FLEXAI_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "flexai" / "config.json"


def read_client_file(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"cannot read the client config {path}: {error}; fix or delete the file"
        ) from error
    if not isinstance(data, dict):
        raise ConfigError(f"the client config {path} is not a JSON object; fix or delete it")
    return {key: str(value) for key, value in data.items() if value is not None}


def load_client_config(api_url: str | None = None, token: str | None = None) -> ClientConfig:
    """Explicit values first, then ``FLEXAI_API_URL``/``FLEXAI_TOKEN``, then the file."""
    path = config_path()
    stored = read_client_file(path)
    url = api_url or os.environ.get("FLEXAI_API_URL") or stored.get("api_url")
    secret = token or os.environ.get("FLEXAI_TOKEN") or stored.get("token")
    if not url:
        raise ConfigError(
            f"no API URL: set FLEXAI_API_URL, or start `flexai server` on this machine "
            f"(it writes {path})"
        )
    if not secret:
        raise ConfigError(
            f"no API token: run `flexai login` (or set FLEXAI_TOKEN); on the server's machine "
            f"`flexai server` wrote the admin's to {path}"
        )
    if url.rstrip("/").endswith("/v1"):
        raise ConfigError(
            f"the API URL {url} ends with /v1: give the server's root, {url.rstrip('/')[:-3]} "
            "(each request adds /v1 itself)"
        )
    return ClientConfig(api_url=url.rstrip("/"), token=secret,
                        ca_file=os.environ.get("FLEXAI_CA_FILE") or stored.get("ca_file"))


def write_client_config(config: ClientConfig, path: Path | None = None) -> Path:
    """Write the config file readable by its owner only; return where it went."""
    target = path or config_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    fields = {"api_url": config.api_url, "token": config.token}
    if config.ca_file:
        fields["ca_file"] = config.ca_file
    payload = json.dumps(fields, indent=2) + "\n"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(payload)
    return target
