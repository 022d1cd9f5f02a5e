"""GPUs inside a job's image, the way the NVIDIA Container Toolkit gives them to containers: the
host's CDI specs (Container Device Interface: ``/etc/cdi/*.yaml|json``, as ``nvidia-ctk cdi
generate`` writes them) say, for each device and for the kind as a whole, which device nodes,
mounts (the driver's libraries and binaries) and environment a container needs.

:func:`device_edits` reads them for the job's allocated devices (by index, as the agent
allocates them, or by any other name the spec gives them) and merges the kind's own edits;
:meth:`DeviceEdits.bwrap_options` turns them into bubblewrap's options and
:meth:`DeviceEdits.environment` into the job's variables. A spec's ``createContainer`` hooks
(``nvidia-ctk hook update-ldcache``) are not run: the folders of the libraries it mounts are put
in ``LD_LIBRARY_PATH`` instead, which is what that hook's ``ldconfig`` achieves.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CDI_FOLDERS = (Path("/etc/cdi"), Path("/var/run/cdi"))
"""Where specs are looked for, as the CDI specification says (the later wins a name)."""
GPU_KIND = "nvidia.com/gpu"
GENERATED = "/etc/cdi/nvidia.yaml"


class CdiError(Exception):
    """A spec that cannot be read, or a device it does not name; the message says which."""


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True)
class DeviceEdits:
    """What a container of these devices needs, merged from the kind's and each device's."""

    device_nodes: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    env: tuple[str, ...] = ()
    """``NAME=VALUE``, in the specs' order (a later one wins)."""
    hooks: tuple[str, ...] = field(default=())
    """The hooks the specs ask for (not run; see the module's note), by name."""

    def bwrap_options(self) -> list[str]:
        """The device nodes bound as devices, the mounts bound (read-only unless the spec says
        ``rw``), at the paths the specs give."""
        options: list[str] = []
        for node in self.device_nodes:
            options += ["--dev-bind", node, node]
        for mount in self.mounts:
            kind = "--ro-bind" if mount.read_only else "--bind"
            options += [kind, mount.host_path, mount.container_path]
        return options

    def environment(self, inherited: Mapping[str, str] | None = None) -> dict[str, str]:
        """The specs' variables, and ``LD_LIBRARY_PATH`` with the folders of the libraries they
        mount first."""
        env = dict(item.split("=", 1) for item in self.env if "=" in item)
        folders = sorted({str(Path(m.container_path).parent) for m in self.mounts
                          if ".so" in Path(m.container_path).name})  # fmt: skip
        if folders:
            before = (inherited or {}).get("LD_LIBRARY_PATH", "")
            env["LD_LIBRARY_PATH"] = ":".join([*folders, *([before] if before else [])])
        return env


def load_specs(folders: Iterable[Path] = CDI_FOLDERS) -> list[dict[str, Any]]:
    """Every spec file in ``folders`` (``*.json``, ``*.yaml``, ``*.yml``), in name order."""
    specs = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix in (".json", ".yaml", ".yml") and path.is_file():
                specs.append(_read(path))
    return specs


def device_edits(specs: Sequence[Mapping[str, Any]], devices: Sequence[int | str],
                 kind: str = GPU_KIND) -> DeviceEdits:  # fmt: skip
    """The edits for ``devices`` (indices or names) of ``kind``: the kind's own edits, then
    each device's (CdiError for a device no spec of that kind names)."""
    of_kind = [spec for spec in specs if spec.get("kind") == kind]
    named: dict[str, Mapping[str, Any]] = {}
    for spec in of_kind:
        for device in spec.get("devices") or ():
            named[str(device.get("name"))] = device.get("containerEdits") or {}
    edits = [spec.get("containerEdits") or {} for spec in of_kind]
    for device in devices:
        found = named.get(str(device))
        if found is None:
            known = ", ".join(sorted(named)) or "none"
            raise CdiError(f"no CDI spec of {kind} names device {device} (it names: {known}); "
                           f"run `nvidia-ctk cdi generate --output={GENERATED}`")  # fmt: skip
        edits.append(found)
    return _merged(edits)


def _merged(edits: Iterable[Mapping[str, Any]]) -> DeviceEdits:
    nodes: list[str] = []
    mounts: list[Mount] = []
    env: list[str] = []
    hooks: list[str] = []
    for edit in edits:
        for node in edit.get("deviceNodes") or ():
            path = str(node.get("hostPath") or node.get("path") or "")
            if path and path not in nodes:
                nodes.append(path)
        for mount in edit.get("mounts") or ():
            made = Mount(str(mount["hostPath"]), str(mount["containerPath"]),
                         "rw" not in (mount.get("options") or ()))  # fmt: skip
            if made not in mounts:
                mounts.append(made)
        env += [str(item) for item in edit.get("env") or ()]
        hooks += [str(hook.get("hookName", "?")) for hook in edit.get("hooks") or ()]
    return DeviceEdits(tuple(nodes), tuple(mounts), tuple(env), tuple(hooks))


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
        loaded = json.loads(text) if path.suffix == ".json" else _yaml(text)
    except (OSError, ValueError) as error:
        raise CdiError(f"cannot read the CDI spec {path}: {error}") from None
    if not isinstance(loaded, dict):
        raise CdiError(f"the CDI spec {path} holds no mapping")
    return loaded


def _yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(str(error).replace("\n", " ")) from None
