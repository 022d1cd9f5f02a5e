"""Which node gets a job: assign, wait, or reject with a reason the user can act on."""

from __future__ import annotations

import pytest

from domain.scheduling import Assign, Decision, NodeCapacity, Reject, Wait, choose_node

PATIENCE_S = 30.0


def node(name: str, accels: int, busy: int = 0, alive: bool = True) -> NodeCapacity:
    return NodeCapacity(node_id=f"id-{name}", name=name, accels=accels, busy_accels=busy,
                        alive=alive)  # fmt: skip


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


@pytest.mark.parametrize("order", [1, -1])
def test_the_live_node_with_most_free_accelerators_is_chosen(order: int) -> None:
    candidates = [node("busy", 8, busy=6), node("free", 8, busy=1), node("half", 8, busy=4)]
    assert choose(2, candidates[::order]) == Assign("id-free", "free")


def test_offline_nodes_are_skipped_however_free() -> None:
    candidates = [node("idle-but-offline", 8, alive=False), node("live", 8, busy=7)]
    assert choose(1, candidates) == Assign("id-live", "live")


def test_nodes_too_small_for_the_request_are_skipped() -> None:
    candidates = [node("small-and-free", 2), node("big", 8, busy=4)]
    assert choose(4, candidates) == Assign("id-big", "big")


def test_a_node_whose_accelerators_are_all_busy_still_takes_the_job_to_queue_it() -> None:
    assert choose(8, [node("full", 8, busy=8)]) == Assign("id-full", "full")


def test_a_multi_node_request_is_rejected_saying_to_use_one_node() -> None:
    decision = choose(1, [node("big", 8)], nodes=2)
    assert isinstance(decision, Reject)
    assert "--nodes 1" in decision.message
