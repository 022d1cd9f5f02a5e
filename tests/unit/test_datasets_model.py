"""The Dataset aggregate: versions by content hash, one per change; bounded values; a job's
spec pins each of its datasets to one version."""

from __future__ import annotations

from typing import Any

import pytest

from domain.datasets import Dataset
from domain.specs import check_dataset_hashes, check_spec
from domain.values import InvalidValue

ALICE = {"kind": "user", "id": "alice"}
FIRST = "a" * 64
SECOND = "b" * 64


def pushed(*hashes: str) -> Dataset:
    dataset = Dataset.create("alice", "mnist", by=ALICE)
    for content_hash in hashes:
        dataset.push(content_hash, size=10, files=2, by=ALICE)
    return dataset


def test_each_push_of_new_content_is_a_new_version_and_the_latest_is_the_last() -> None:
    dataset = pushed(FIRST, SECOND)
    assert [version["version"] for version in dataset.versions] == [1, 2]
    assert dataset.latest is not None and dataset.latest["content_hash"] == SECOND
    names = [type(event).__name__ for event in dataset.collect_events()]
    assert names == ["Created", "Pushed", "Pushed"]


def test_pushing_the_content_of_the_latest_version_again_records_nothing() -> None:
    dataset = pushed(FIRST)
    dataset.collect_events()
    assert dataset.push(FIRST, size=10, files=2, by=ALICE) is False
    assert dataset.collect_events() == []
    assert dataset.push(SECOND, size=10, files=2, by=ALICE) is True
    assert dataset.push(FIRST, size=10, files=2, by=ALICE) is True  # back to the first: new
    assert len(dataset.versions) == 3


def test_a_dataset_replays_to_the_same_versions() -> None:
    dataset = pushed(FIRST, SECOND)
    events = dataset.collect_events()
    replayed: Any = None
    for domain_event in events:
        replayed = domain_event.mutate(replayed)
    assert replayed.versions == dataset.versions and replayed.name == "mnist"


def test_the_id_is_one_per_owner_and_name() -> None:
    assert Dataset.create_id("alice", "mnist") == Dataset.create_id("alice", "mnist")
    assert Dataset.create_id("alice", "mnist") != Dataset.create_id("bob", "mnist")
    assert Dataset.create("alice", "mnist", by=ALICE).id == Dataset.create_id("alice", "mnist")


@pytest.mark.parametrize("name", ["../etc", "", ".hidden", "a/b", "x" * 129, "bad\x00"])
def test_a_name_outside_the_rule_is_refused(name: str) -> None:
    with pytest.raises(InvalidValue) as refused:
        Dataset.create("alice", name, by=ALICE)
    assert refused.value.field == "name"


@pytest.mark.parametrize(
    ("facts", "field"),
    [
        ({"content_hash": "A" * 64}, "content_hash"),
        ({"content_hash": "a" * 63}, "content_hash"),
        ({"size": -1}, "size"),
        ({"size": 2**63}, "size"),
        ({"files": True}, "files"),
    ],
)
def test_pushed_facts_out_of_bounds_are_refused(facts: dict[str, Any], field: str) -> None:
    dataset = pushed()
    with pytest.raises(InvalidValue) as refused:
        dataset.push(**{"content_hash": FIRST, "size": 1, "files": 1, **facts}, by=ALICE)
    assert refused.value.field == field
    assert dataset.versions == []


def spec(**change: Any) -> dict[str, Any]:
    return {"repository_url": "https://example.com/r.git", "entry_point": ["train.py"],
            "accels": 1, "nodes": 1, "datasets": ["mnist"], **change}  # fmt: skip


def test_a_job_spec_pins_its_datasets_to_versions() -> None:
    check_spec(spec(dataset_hashes={"mnist": FIRST}))
    check_spec(spec(dataset_hashes={}))  # not pushed when submitted: left to the node


@pytest.mark.parametrize(
    ("hashes", "field"),
    [
        ({"cifar": FIRST}, "dataset_hashes.cifar"),
        ({"mnist": "not-a-hash"}, "dataset_hashes.mnist"),
        ({"../x": FIRST}, "dataset_hashes key"),
        ([FIRST], "dataset_hashes"),
    ],
)
def test_a_pin_for_another_dataset_or_not_a_hash_is_refused(hashes: Any, field: str) -> None:
    with pytest.raises(InvalidValue) as refused:
        check_spec(spec(dataset_hashes=hashes))
    assert refused.value.field == field


def test_pins_are_checked_against_the_datasets_whatever_their_shape() -> None:
    with pytest.raises(InvalidValue):
        check_dataset_hashes({"mnist": FIRST}, [{"not": "a name"}])
