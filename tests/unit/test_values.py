"""The bounds of values: every accepted value fits the views' columns and encodes as UTF-8."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.actors import agent, user
from domain.errors import InvalidJobSpec
from domain.job import TrainingJob
from domain.node import Node
from domain.specs import check_env, check_spec
from domain.values import (
    BIGINT_MAX,
    InvalidValue,
    check_accelerators,
    check_checkpoint_name,
    check_commit,
    check_text,
    clean_checkpoint_facts,
)

NODE = agent("gpu-node-1")


def spec(**change: Any) -> dict[str, Any]:
    return {"repository_url": "https://example.com/r.git", "entry_point": ["train.py"],
            "accels": 1, "nodes": 1, **change}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"accels": 2**70}, "accels"),
        ({"accels": -1}, "accels"),
        ({"nodes": 10**6}, "nodes"),
        ({"repository_url": "https://x\x00y"}, "repository_url"),
        ({"repository_url": "u" * 3000}, "repository_url"),
        ({"repository_revision": "--upload-pack=touch /tmp/x"}, "repository_revision"),
        ({"repository_revision": "main\n"}, "repository_revision"),
        ({"requirements_path": "../../etc/passwd"}, "requirements_path"),
        ({"requirements_path": "/etc/passwd"}, "requirements_path"),
        ({"env": {f"K{i}": "v" for i in range(2000)}}, "env"),
        ({"env": {"1BAD": "v"}}, "env key"),
        ({"env": {"K": "a\x00b"}}, "env.K"),
        ({"env": {"K": "x" * 40000}}, "env.K"),
        ({"secrets": {"TOKEN": "no such/name"}}, "secrets.TOKEN"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env.CUDA_VISIBLE_DEVICES"),
        ({"env": {"FLEXAI_OUTPUT_DIR": "/tmp"}}, "env.FLEXAI_OUTPUT_DIR"),
        ({"secrets": {"MASTER_ADDR": "addr"}}, "secrets.MASTER_ADDR"),
        ({"datasets": ["../etc"]}, "datasets[0]"),
        ({"datasets": [f"d{i}" for i in range(100)]}, "datasets"),
        ({"checkpoint": "c\x01"}, "checkpoint"),
        ({"entry_point": ["train.py", "a\x00"]}, "entry_point[1]"),
        ({"entry_point": ["x"] * 2000}, "entry_point"),
        ({"entry_point": ["train\ud800.py"]}, "entry_point[0]"),
        ({"entry_point": ["", "train.py"]}, "entry_point[0]"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_spec_value_out_of_bounds_is_refused_naming_its_field(
    change: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidValue) as refused:
        check_spec(spec(**change))
    assert refused.value.field == field
    with pytest.raises(InvalidJobSpec) as by_the_model:
        TrainingJob.submit(owner="alice", name="my-job", spec=spec(**change), by=user("alice"))
    assert by_the_model.value.field == field


def test_an_entry_point_names_its_program_but_its_arguments_may_be_empty() -> None:
    assert check_spec(spec(entry_point=["train.py", "--tag", ""])) is None
    with pytest.raises(InvalidValue, match="must not be empty"):
        check_spec(spec(entry_point=[""]))


def test_multi_line_text_may_hold_newlines_and_tabs_but_no_other_control_characters() -> None:
    assert check_text("a\n\tb", "message", max_length=10, multiline=True) == "a\n\tb"
    with pytest.raises(InvalidValue, match="control character U\\+001B"):
        check_text("a\x1b[31m", "message", max_length=10, multiline=True)
    with pytest.raises(InvalidValue, match="control character U\\+000A"):
        check_text("a\nb", "name", max_length=10)


@given(st.text(max_size=30))
def test_accepted_text_always_encodes_as_utf8_without_nul(text: str) -> None:
    try:
        accepted = check_text(text, "value", max_length=30, multiline=True, required=False)
    except InvalidValue:
        return
    assert "\x00" not in accepted
    accepted.encode("utf-8")


@given(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=5))
def test_accepted_env_round_trips_through_json(env: dict[str, str]) -> None:
    try:
        accepted = check_env(env)
    except InvalidValue:
        return
    assert json.loads(json.dumps(accepted, ensure_ascii=False).encode().decode()) == env


def test_agent_facts_are_bounded() -> None:
    assert check_commit("c0ffee") == "c0ffee"
    for bad in ("C0FFEE", "xyz", "a" * 65, "abc"):
        with pytest.raises(InvalidValue):
            check_commit(bad)
    assert check_accelerators([0, 3]) == [0, 3]
    for indices in ([2**64], [-1], [1, 1], list(range(2000))):
        with pytest.raises(InvalidValue):
            check_accelerators(indices)


@pytest.mark.parametrize("name", [".", "..", "a/b", "bad\x00name", "x" * 256, "tab\tname", None])
def test_a_checkpoint_name_is_one_printable_file_name(name: str) -> None:
    with pytest.raises(InvalidValue):
        check_checkpoint_name(name)


def test_the_root_checkpoints_name_is_empty() -> None:
    assert check_checkpoint_name("") == ""


def test_what_a_checkpoint_claims_of_itself_is_kept_only_where_it_fits() -> None:
    claims = {"size": 10, "step": 2**70, "train_loss": math.nan, "eval_loss": "0.1",
              "model": "Bert\x00Model", "version": 4, "inference_ready": 1}  # fmt: skip
    assert clean_checkpoint_facts(claims) == {
        "size": 10, "step": None, "train_loss": None, "eval_loss": None, "model": "BertModel",
        "version": None, "inference_ready": True,
    }  # fmt: skip
    assert clean_checkpoint_facts({"step": BIGINT_MAX, "train_loss": 10**400})["step"] == (
        BIGINT_MAX
    )


def test_the_model_refuses_agent_facts_out_of_bounds() -> None:
    job = TrainingJob.submit(owner="alice", name="my-job", spec=spec(), by=user("alice"))
    job.begin_scheduling(by=agent("scheduler"))
    job.assign("node-1", "gpu-node-1", by=agent("scheduler"))
    with pytest.raises(InvalidJobSpec, match="accelerators"):
        job.start("c0ffee", [2**64], by=NODE)
    with pytest.raises(InvalidJobSpec, match="code"):
        job.fail_build("Bad Code", "x", None, by=NODE)
    with pytest.raises(InvalidJobSpec, match="master_port"):
        job.record_built(0, "c0ffee", 70000, by=NODE)
    job.record_built(0, "c0ffee", None, by=NODE)
    job.start("c0ffee", [0], by=NODE)
    with pytest.raises(InvalidJobSpec, match="exit_code"):
        job.finish(2**40, by=NODE)
    with pytest.raises(InvalidJobSpec, match="checkpoint name"):
        job.record_checkpoint({"id": "c1", "name": "a\x00b"}, by=NODE)
    assert job.status == "in progress"


@pytest.mark.parametrize(("name", "accels"), [("bad\x00node", 1), ("-node", 1), ("n", 2**70)])
def test_a_node_out_of_bounds_is_refused(name: str, accels: int) -> None:
    with pytest.raises(InvalidJobSpec):
        Node.register(name, accels, "H100", by=agent(name))
