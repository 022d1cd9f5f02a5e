"""A job's spec, typed (``common/job_spec.py``): every field's default in one place, every spec
the ledger stored read back (those of older code lack fields), and the dictionary it writes the
one the ledger has always stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common.job_spec import JobSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LEDGERS = ("ledger-2026-12.json", "ledger-2026-12-07.json")


def stored_specs(name: str) -> list[dict[str, Any]]:
    """The specs of the ``Submitted`` events of a stored ledger, as stored."""
    specs = []
    for event in json.loads((FIXTURES / name).read_text())["events"]:
        if event["topic"].endswith(".Submitted"):
            state = event["state"]
            specs.append((json.loads(state) if isinstance(state, str) else state)["spec"])
    return specs


AS_TODAYS_API_STORES = {
    "repository_url": "https://example.com/org/repo.git", "repository_revision": None,
    "requirements_path": "requirements.txt", "accels": 2, "nodes": 1, "env": {"A": "1"},
    "secrets": {"HF_TOKEN": "hf"}, "datasets": ["mnist", "cifar"], "checkpoint": "warm",
    "entry_point": ["train.py", "--epochs", "3"], "time_limit_s": 86400, "stop_grace_s": None,
    "input_checkpoint_id": "0f3c", "dataset_mounts": {"cifar": "images"},
    "dataset_hashes": {"mnist": "a" * 64, "cifar": "b" * 64}, "priority": "low",
    "preemptible": False, "max_retries": 2, "retry_on_exit_codes": [137],
}  # fmt: skip
"""A spec as ``POST /v1/jobs`` recorded it: every field of the body, the pins, the sharing
fields that differ from their defaults."""


def test_a_spec_that_names_only_its_repository_and_entry_point_has_every_default() -> None:
    spec = JobSpec.from_dict({"repository_url": "/repo", "entry_point": ["train.py"]})
    assert spec == JobSpec(repository_url="/repo", entry_point=("train.py",))
    assert (spec.requirements_path, spec.accels, spec.nodes, spec.time_limit_s) == (
        "requirements.txt", 1, 1, None)  # fmt: skip
    assert (spec.priority, spec.rank, spec.may_be_preempted, spec.max_retries) == (
        "normal", 1, False, 0)  # fmt: skip
    assert spec.retry_codes == frozenset()


@pytest.mark.parametrize("ledger", LEDGERS)
def test_every_spec_a_stored_ledger_holds_reads_as_it_was_asked(ledger: str) -> None:
    specs = stored_specs(ledger)
    assert specs
    for stored in specs:
        spec = JobSpec.from_dict(stored)
        assert spec.repository_url == stored["repository_url"]
        assert spec.entry_point == tuple(stored["entry_point"])
        assert (spec.accels, spec.nodes) == (stored["accels"], stored["nodes"])
        assert spec.time_limit_s == stored.get("time_limit_s")
        assert spec.stop_grace_s == stored.get("stop_grace_s")
        assert spec.env == stored.get("env", {})
        assert spec.max_retries == stored.get("max_retries", 0)
        assert spec.may_be_preempted is bool(stored.get("preemptible", False))
        assert JobSpec.from_dict(spec.to_dict()) == spec


def test_the_newer_ledger_holds_the_sharing_fields_of_its_day() -> None:
    specs = [JobSpec.from_dict(stored) for stored in stored_specs("ledger-2026-12-07.json")]
    assert any(spec.max_retries == 2 for spec in specs)
    assert any(spec.may_be_preempted and spec.priority == "normal" for spec in specs)


def test_a_spec_as_todays_api_stores_it_is_written_back_the_same() -> None:
    spec = JobSpec.from_dict(AS_TODAYS_API_STORES)
    assert spec.to_dict() == AS_TODAYS_API_STORES
    assert (spec.rank, spec.may_be_preempted, spec.retry_codes) == (0, False, {137})
    assert spec.dataset_mounts == {"cifar": "images"}


def test_sharing_fields_at_their_defaults_and_empty_pins_are_not_written() -> None:
    written = JobSpec(repository_url="/r", entry_point=("t.py",), priority="low",
                      preemptible=True).to_dict()  # fmt: skip
    assert written["priority"] == "low"
    assert not {"preemptible", "max_retries", "retry_on_exit_codes", "dataset_mounts",
                "dataset_hashes"} & set(written)  # fmt: skip
    assert JobSpec.from_dict(written).may_be_preempted  # low: preemptible unless it says not


def test_whole_seconds_stay_whole_and_the_agents_fractions_stay_fractions() -> None:
    assert JobSpec.from_dict({"stop_grace_s": 5}).to_dict()["stop_grace_s"] == 5
    assert isinstance(JobSpec.from_dict({"stop_grace_s": 5}).stop_grace_s, int)
    assert JobSpec.from_dict({"stop_grace_s": 0.2}).stop_grace_s == 0.2
