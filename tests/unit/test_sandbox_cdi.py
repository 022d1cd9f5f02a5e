"""A host's CDI specs, as ``nvidia-ctk cdi generate`` writes them, applied for a job's allocated
GPUs: their device nodes, the driver's files and the environment, as bubblewrap options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node_agent.sandbox.cdi import CdiError, DeviceEdits, Mount, device_edits, load_specs

LIB = "/usr/lib/x86_64-linux-gnu"
SPEC_YAML = f"""\
---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
- name: GPU-5a2b
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidia-modeset
  - path: /dev/nvidiactl
  - path: /dev/nvidia-uvm
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache, --folder, {LIB}]
  mounts:
  - hostPath: {LIB}/libcuda.so.535.104.05
    containerPath: {LIB}/libcuda.so.535.104.05
    options: [ro, nosuid, nodev, bind]
  - hostPath: /usr/bin/nvidia-smi
    containerPath: /usr/bin/nvidia-smi
    options: [ro, nosuid, nodev, bind]
  - hostPath: /run/nvidia-persistenced/socket
    containerPath: /run/nvidia-persistenced/socket
    options: [nosuid, nodev, bind, rw]
"""


@pytest.fixture
def cdi(tmp_path: Path) -> Path:
    folder = tmp_path / "cdi"
    folder.mkdir()
    (folder / "nvidia.yaml").write_text(SPEC_YAML)
    fpga = {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/fpga0"}]}}
    other = {"cdiVersion": "0.5.0", "kind": "vendor.example/fpga", "devices": [fpga]}
    (folder / "fpga.json").write_text(json.dumps(other))
    (folder / "notes.txt").write_text("not a spec")
    return folder


def test_a_jobs_gpus_get_their_nodes_the_kinds_nodes_the_driver_and_its_environment(
    cdi: Path,
) -> None:
    edits = device_edits(load_specs([cdi]), [1])
    assert edits.device_nodes == ("/dev/nvidia-modeset", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                  "/dev/nvidia1")  # fmt: skip
    assert "/dev/nvidia0" not in edits.device_nodes  # another job's GPU
    assert Mount(f"{LIB}/libcuda.so.535.104.05", f"{LIB}/libcuda.so.535.104.05") in edits.mounts
    assert Mount("/run/nvidia-persistenced/socket", "/run/nvidia-persistenced/socket",
                 read_only=False) in edits.mounts  # fmt: skip
    assert edits.hooks == ("createContainer",)
    options = edits.bwrap_options()
    assert options[:3] == ["--dev-bind", "/dev/nvidia-modeset", "/dev/nvidia-modeset"]
    assert options[15:18] == ["--ro-bind", "/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"]
    assert options[-3:] == ["--bind", "/run/nvidia-persistenced/socket",
                            "/run/nvidia-persistenced/socket"]  # fmt: skip
    env = edits.environment({"LD_LIBRARY_PATH": "/opt/lib"})
    assert env == {"NVIDIA_VISIBLE_DEVICES": "void", "LD_LIBRARY_PATH": f"{LIB}:/opt/lib"}


def test_devices_are_named_by_index_or_by_the_specs_other_names_and_merged_once(
    cdi: Path,
) -> None:
    specs = load_specs([cdi])
    both = device_edits(specs, [0, "GPU-5a2b"])
    assert both.device_nodes[-2:] == ("/dev/nvidia0", "/dev/nvidia1")
    assert device_edits(specs, ["0"], kind="vendor.example/fpga").device_nodes == ("/dev/fpga0",)
    assert device_edits(specs, []).environment() == {"NVIDIA_VISIBLE_DEVICES": "void",
                                                     "LD_LIBRARY_PATH": LIB}  # fmt: skip


def test_a_device_no_spec_names_or_a_spec_that_cannot_be_read_is_a_clear_error(
    cdi: Path, tmp_path: Path
) -> None:
    with pytest.raises(CdiError, match=r"names device 7 \(it names: 0, 1, GPU-5a2b\); run "
                                       r"`nvidia-ctk cdi generate"):
        device_edits(load_specs([cdi]), [7])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "nvidia.yaml").write_text("kind: [unclosed\n")
    with pytest.raises(CdiError, match="cannot read the CDI spec .*nvidia.yaml"):
        load_specs([broken])
    assert load_specs([tmp_path / "absent"]) == []
    assert DeviceEdits().bwrap_options() == [] and DeviceEdits().environment() == {}
