"""Which node gets a job: assign, wait, or reject with a reason the user can act on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.scheduling import Assign, Decision, NodeCapacity, Reject, Wait, choose_node

PATIENCE_S = 30.0


def node(name: str, accels: int, busy: int = 0, alive: bool = True) -> NodeCapacity:
    return NodeCapacity(node_id=f"id-{name}", name=name, accels=accels, busy_accels=busy,
                        alive=alive, held=busy)  # fmt: skip


def choose(
    accels: int, candidates: list[NodeCapacity], waited_s: float = 0.0, nodes: int = 1
) -> Decision:
    return choose_node(accels, nodes, candidates, waited_s=waited_s, patience_s=PATIENCE_S)


def test_a_request_no_registered_node_could_meet_is_rejected_at_once_naming_the_largest() -> None:
    decision = choose(16, [node("small", 4), node("medium", 8, alive=False)])
    assert isinstance(decision, Reject)
    assert decision.code == "no_node_meets_request"
    assert "no registered node has 16 accelerators (the largest has 8)" in decision.message
    assert "--accels" in decision.message


def test_with_no_node_registered_the_job_waits_then_is_rejected() -> None:
    assert isinstance(choose(1, [], waited_s=0.0), Wait)
    assert isinstance(choose(1, [], waited_s=PATIENCE_S - 0.1), Wait)
    decision = choose(1, [], waited_s=PATIENCE_S)
    assert isinstance(decision, Reject)
    assert decision.code == "no_node_available"
    assert "no node was registered within 30 s" in decision.message
    assert "flexai agent" in decision.message


def test_when_only_offline_nodes_are_big_enough_the_job_waits_then_is_rejected() -> None:
    candidates = [node("big", 8, alive=False), node("small", 2)]
    assert isinstance(choose(4, candidates, waited_s=1.0), Wait)
    decision = choose(4, candidates, waited_s=PATIENCE_S + 1)
    assert isinstance(decision, Reject)
    assert decision.code == "no_node_available"
    assert "offline" in decision.message and "restart its agent" in decision.message


def placed(decision: Decision) -> list[str]:
    assert isinstance(decision, Assign), decision
    return [node.name for node in decision.nodes]


@pytest.mark.parametrize("order", [1, -1])
def test_the_live_node_with_most_free_accelerators_is_chosen(order: int) -> None:
    candidates = [node("busy", 8, busy=6), node("free", 8, busy=1), node("half", 8, busy=4)]
    assert placed(choose(2, candidates[::order])) == ["free"]


def test_offline_nodes_are_skipped_however_free() -> None:
    candidates = [node("idle-but-offline", 8, alive=False), node("live", 8, busy=7)]
    assert placed(choose(1, candidates)) == ["live"]


def test_nodes_too_small_for_the_request_are_skipped() -> None:
    candidates = [node("small-and-free", 2), node("big", 8, busy=4)]
    assert placed(choose(4, candidates)) == ["big"]


def test_a_node_whose_accelerators_are_all_busy_still_takes_the_job_to_queue_it() -> None:
    running = NodeCapacity("id-full", "full", 8, busy_accels=8, alive=True, held=8)
    assert placed(choose(8, [running])) == ["full"]


def test_a_node_takes_one_nodes_worth_of_waiting_jobs_then_jobs_wait_for_room() -> None:
    lined_up = NodeCapacity("id-full", "full", 8, busy_accels=16, alive=True, held=8)
    decision = choose(1, [lined_up], waited_s=PATIENCE_S * 10)
    assert isinstance(decision, Wait)  # never rejected: it fits, it waits its turn
    assert decision.reason == (
        "waits for its turn: the 1 live node big enough has a full line of jobs waiting to run"
    )


def test_a_multi_node_job_gets_that_many_distinct_nodes_the_freest_first() -> None:
    candidates = [node("a", 8, busy=8), node("b", 8), node("c", 8, busy=2), node("tiny", 1)]
    assert placed(choose(4, candidates, nodes=2)) == ["b", "c"]
    assert placed(choose(4, candidates, nodes=3)) == ["b", "c", "a"]


def test_a_multi_node_job_more_nodes_than_the_fleet_could_ever_give_is_rejected_at_once() -> None:
    decision = choose(4, [node("a", 8), node("b", 8), node("tiny", 2)], nodes=3)
    assert isinstance(decision, Reject) and decision.code == "no_node_meets_request"
    assert "3 nodes with 4 accelerators each" in decision.message
    assert "only 2 of the 3 registered nodes" in decision.message and "--nodes" in decision.message


def test_a_multi_node_job_waits_for_enough_live_nodes_saying_how_many_are_live() -> None:
    candidates = [node("a", 8), node("b", 8, alive=False)]
    decision = choose(1, candidates, nodes=2)
    assert isinstance(decision, Wait)
    assert decision.reason == (
        "waits for 2 live nodes with 1 accelerator; 1 of the 2 registered are live"
    )
    assert [n.name for n in decision.candidates] == ["a", "b"]
    late = choose(1, candidates, nodes=2, waited_s=PATIENCE_S)
    assert isinstance(late, Reject) and late.code == "no_node_available"
    assert "only 1 of the 2 nodes" in late.message


fleets = st.lists(
    st.builds(NodeCapacity, node_id=st.uuids().map(str), name=st.from_regex(r"\An[0-9]{1,3}\Z"),
              accels=st.integers(0, 16), busy_accels=st.integers(0, 40), alive=st.booleans(),
              held=st.integers(0, 16)),
    max_size=8, unique_by=lambda n: n.node_id,
)  # fmt: skip


@given(fleet=fleets, accels=st.integers(1, 16), nodes=st.integers(1, 4),
       waited=st.floats(0, 2 * PATIENCE_S))  # fmt: skip
def test_a_job_that_fits_the_live_fleet_is_placed_never_rejected_on_distinct_big_nodes(
    fleet: list[NodeCapacity], accels: int, nodes: int, waited: float
) -> None:
    decision = choose(accels, fleet, waited_s=waited, nodes=nodes)
    fits_now = sum(n.alive and n.accels >= accels for n in fleet) >= nodes
    could_ever = sum(n.accels >= accels for n in fleet) >= nodes
    roomy_now = sum(n.alive and n.accels >= accels and n.has_room(accels) for n in fleet)
    if roomy_now >= nodes:
        assert isinstance(decision, Assign)
        assert len({n.node_id for n in decision.nodes}) == nodes
        assert all(n.alive and n.accels >= accels and n.has_room(accels)
                   for n in decision.nodes)  # fmt: skip
    elif fits_now:  # it fits, but the lines are full: it waits, never rejected
        assert isinstance(decision, Wait) and "full line" in decision.reason
    elif fleet and not could_ever:
        assert isinstance(decision, Reject) and decision.code == "no_node_meets_request"
    elif waited < PATIENCE_S:
        assert isinstance(decision, Wait)
    else:
        assert isinstance(decision, Reject) and decision.code == "no_node_available"


IMAGE = "docker://registry.example.com/team/train:1"


def holding(base: NodeCapacity, *images: str) -> NodeCapacity:
    return NodeCapacity(base.node_id, base.name, base.accels, base.busy_accels, base.alive,
                        held=base.held, images=frozenset(images))  # fmt: skip


def test_a_job_with_an_image_goes_to_a_node_that_holds_it_when_both_fit() -> None:
    fleet = [node("freest", 8), holding(node("holder", 8, busy=4), IMAGE)]
    assert placed(choose_node(2, 1, fleet, 0.0, PATIENCE_S, IMAGE)) == ["holder"]
    assert placed(choose_node(2, 1, fleet, 0.0, PATIENCE_S)) == ["freest"]
    assert placed(choose_node(2, 1, fleet, 0.0, PATIENCE_S, IMAGE + "x")) == ["freest"]
    both = [*fleet, node("second", 8, busy=1)]
    assert placed(choose_node(2, 2, both, 0.0, PATIENCE_S, IMAGE)) == ["holder", "freest"]


def test_a_holder_with_no_room_now_does_not_beat_a_node_that_can_start_the_job() -> None:
    fleet = [holding(node("busy-holder", 8, busy=7), IMAGE), node("free", 8, busy=2)]
    assert placed(choose_node(4, 1, fleet, 0.0, PATIENCE_S, IMAGE)) == ["free"]
    busy = [holding(node("busy-holder", 8, busy=7), IMAGE), node("busier", 8, busy=6)]
    assert placed(choose_node(4, 1, busy, 0.0, PATIENCE_S, IMAGE)) == ["busy-holder"]


@given(fleet=fleets, accels=st.integers(1, 16), nodes=st.integers(1, 4))
def test_a_job_whose_image_no_node_holds_is_placed_as_one_with_none(
    fleet: list[NodeCapacity], accels: int, nodes: int
) -> None:
    held = [holding(n, "docker://r.io/other:1") for n in fleet]
    assert choose_node(accels, nodes, held, 0.0, PATIENCE_S, IMAGE) == \
        choose_node(accels, nodes, held, 0.0, PATIENCE_S)  # fmt: skip
