"""Commands on one node take turns; commands on other nodes do not wait; no two wait for each
other whatever order they name their nodes in."""

from __future__ import annotations

import threading
import time

from domain.node_turns import NodeTurns


def test_two_commands_on_one_node_take_turns_and_others_go_on() -> None:
    turns = NodeTurns()
    inside: list[str] = []
    entered, leave = threading.Event(), threading.Event()

    def first() -> None:
        with turns.holding(["node-a"]):
            inside.append("first")
            entered.set()
            leave.wait(5)
            inside.append("first done")

    def second() -> None:
        with turns.holding(["node-a", "node-a"]):
            inside.append("second")

    one = threading.Thread(target=first)
    one.start()
    assert entered.wait(5)
    two = threading.Thread(target=second)
    two.start()
    with turns.holding(["node-b"]):  # another node's turn is free meanwhile
        time.sleep(0.05)
        assert inside == ["first"]  # the second waits for node-a
    leave.set()
    one.join(5)
    two.join(5)
    assert inside == ["first", "first done", "second"]


def test_commands_naming_their_nodes_in_any_order_never_wait_for_each_other() -> None:
    turns = NodeTurns()
    done: list[int] = []

    def command(index: int, nodes: list[str]) -> None:
        for _ in range(200):
            with turns.holding(nodes):
                pass
        done.append(index)

    threads = [threading.Thread(target=command, args=(n, order)) for n, order in
               enumerate((["a", "b", "c"], ["c", "b", "a"], ["b", "a"], ["c", "a"]))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(done) == [0, 1, 2, 3]


def test_a_command_on_no_node_takes_no_turn() -> None:
    turns = NodeTurns()
    with turns.holding(["a"]), turns.holding([]), turns.holding(["a"]):  # a command's retry
        pass
