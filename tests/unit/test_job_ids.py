"""A job's id is a UUID of version 7: made later, it sorts later, so the indexes keyed by job
ids grow at one edge (domain.ids.time_ordered_id)."""

from __future__ import annotations

import time
import uuid

from hypothesis import given
from hypothesis import strategies as st

from domain.actors import user
from domain.ids import time_ordered_id
from domain.job import TrainingJob

SPEC = {"repository_url": "https://example.com/r.git", "entry_point": ["t.py"], "accels": 1,
        "nodes": 1}  # fmt: skip
MS = st.integers(0, 2**48 - 1)
BITS = st.integers(0, 2**74 - 1)


@given(MS, BITS)
def test_an_id_is_a_version_7_uuid_holding_its_milliseconds_and_random_bits(
    ms: int, bits: int
) -> None:
    made = time_ordered_id(ms, bits)
    assert made.version == 7 and made.variant == uuid.RFC_4122
    assert made.int >> 80 == ms
    assert (made.int >> 64 & 0xFFF, made.int & (2**62 - 1)) == (bits >> 62, bits % 2**62)
    assert uuid.UUID(str(made)) == made


@given(MS, MS, BITS, BITS)
def test_ids_of_different_milliseconds_sort_as_their_times_in_every_form(
    first: int, second: int, bits: int, other: int
) -> None:
    if first == second:
        return
    one, two = time_ordered_id(first, bits), time_ordered_id(second, other)
    assert (one < two) == (str(one) < str(two)) == (one.hex < two.hex) == (first < second)


def test_a_submitted_job_has_one_made_now_and_a_later_job_a_later_one() -> None:
    before = time.time_ns() // 1_000_000
    first = TrainingJob.submit("alice", "first", dict(SPEC), by=user("alice"))
    time.sleep(0.002)
    second = TrainingJob.submit("alice", "second", dict(SPEC), by=user("alice"))
    after = time.time_ns() // 1_000_000
    assert first.id.version == second.id.version == 7
    assert before <= first.id.int >> 80 < second.id.int >> 80 <= after
    assert str(first.id) < str(second.id)
