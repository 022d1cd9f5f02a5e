"""The scheduling policy: priority, fair share, quotas, room by priority, preemption, and no
starvation."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from domain.policy import Lined, Plan, Preempt, Queued, Running, decayed_usage, plan
from domain.scheduling import Assign, NodeCapacity, Reject, Wait

LOW, NORMAL, HIGH = 0, 1, 2
OWNERS = ("alice", "bob", "carol")
HOUR = 3600.0


def node(name: str, accels: int = 8, alive: bool = True) -> NodeCapacity:
    return NodeCapacity(node_id=name, name=name, accels=accels, busy_accels=0, alive=alive)


def queued(job_id: str, owner: str = "alice", accels: int = 1, priority: int = NORMAL,
           submitted: float = 0.0, nodes: int = 1) -> Queued:  # fmt: skip
    return Queued(job_id, owner, accels, nodes, priority, submitted)


def run_plan(queue: Sequence[Queued], nodes: Sequence[NodeCapacity],
             lined: Sequence[Lined] = (), running: Sequence[Running] = (),
             usage: dict[str, float] | None = None, quotas: dict[str, int] | None = None,
             held: dict[str, int] | None = None, preempt_after_s: float | None = 300.0,
             ) -> Plan:  # fmt: skip
    return plan(queue, nodes, list(lined), list(running), usage or {}, quotas or {}, held or {},
                patience_s=60.0, preempt_after_s=preempt_after_s)  # fmt: skip


# -- examples ---------------------------------------------------------------------------------


def test_higher_priority_goes_first_whatever_its_owner_used() -> None:
    result = run_plan([queued("low", "bob", priority=LOW), queued("high", "alice", priority=HIGH)],
                      [node("n1")], usage={"alice": 900.0, "bob": 0.0})  # fmt: skip
    assert result.order == ("high", "low")
    assert result.reasons["high"].startswith("priority high; fair share: alice holds 900.0")


def test_among_equal_priority_the_owner_who_used_least_goes_first_and_is_told_so() -> None:
    result = run_plan([queued("a", "alice", submitted=1.0), queued("b", "bob", submitted=2.0)],
                      [node("n1")], usage={"alice": 5.0, "bob": 3.2})  # fmt: skip
    assert result.order == ("b", "a")
    assert result.reasons["b"] == ("priority normal; fair share: bob holds 3.2 accelerator-hours "
                                   "(24 h half-life), the least of those waiting")  # fmt: skip


def test_owners_of_equal_usage_take_turns_and_each_owner_is_oldest_first() -> None:
    queue = [queued(f"a{i}", "alice", submitted=i) for i in range(3)]
    queue += [queued(f"b{i}", "bob", submitted=10 + i) for i in range(3)]
    assert run_plan(queue, [node("n1")]).order == ("a0", "b0", "a1", "b1", "a2", "b2")


def test_a_job_over_its_owners_quota_waits_without_taking_room_from_others() -> None:
    result = run_plan([queued("big", "alice", accels=4), queued("other", "bob", accels=4)],
                      [node("n1", accels=4)], quotas={"alice": 8}, held={"alice": 6})  # fmt: skip
    assert result.decisions["big"] == Wait("quota: alice runs 6 of 8 accelerators")
    assert isinstance(result.decisions["other"], Assign)


def test_a_job_larger_than_its_owners_quota_says_so() -> None:
    result = run_plan([queued("huge", "alice", accels=8, nodes=2)], [node("n1"), node("n2")],
                      quotas={"alice": 8})  # fmt: skip
    decision = result.decisions["huge"]
    assert isinstance(decision, Wait)
    assert decision.reason.startswith("quota: alice runs 0 of 8 accelerators; this job alone")


def test_quota_counts_what_this_round_placed() -> None:
    queue = [queued(f"j{i}", "alice", accels=2, submitted=i) for i in range(3)]
    result = run_plan(queue, [node("n1")], quotas={"alice": 4})
    assert [type(result.decisions[f"j{i}"]) for i in range(3)] == [Assign, Assign, Wait]
    assert result.decisions["j2"] == Wait("quota: alice runs 4 of 4 accelerators")


def test_a_high_job_joins_a_line_full_of_lower_jobs_and_a_normal_one_does_not() -> None:
    lined = [Lined("old", "carol", 8, ("n1",), NORMAL, waited_s=5.0)]
    queue = [queued("normal", "alice", accels=8), queued("high", "bob", accels=8, priority=HIGH)]
    result = run_plan(queue, [node("n1")], lined=lined)
    assert isinstance(result.decisions["high"], Assign)
    normal = result.decisions["normal"]
    assert isinstance(normal, Wait) and "full line" in normal.reason


def test_a_long_waiting_high_job_preempts_the_newest_lowest_job_of_another_owner() -> None:
    lined = [Lined("urgent", "alice", 4, ("n1",), HIGH, waited_s=600.0)]
    running = [
        Running("mine", "alice", 2, ("n1",), LOW, preemptible=True, started=50.0),
        Running("normal", "bob", 2, ("n1",), NORMAL, preemptible=True, started=90.0),
        Running("old-low", "bob", 2, ("n1",), LOW, preemptible=True, started=10.0),
        Running("new-low", "carol", 2, ("n1",), LOW, preemptible=True, started=80.0),
    ]
    result = run_plan([], [node("n1")], lined=lined, running=running)
    assert result.preemptions == (Preempt("new-low", "urgent", "n1"),
                                  Preempt("old-low", "urgent", "n1"))  # fmt: skip


@pytest.mark.parametrize(
    ("waited_s", "preempt_after_s", "preemptible", "preempting"),
    [
        (100.0, 300.0, True, False),
        (600.0, None, True, False),
        (600.0, 300.0, False, False),
        (600.0, 300.0, True, True),
    ],  # fmt: skip
)
def test_no_preemption_too_soon_when_off_of_a_protected_job_or_twice(
    waited_s: float, preempt_after_s: float | None, preemptible: bool, preempting: bool
) -> None:
    lined = [Lined("urgent", "alice", 8, ("n1",), HIGH, waited_s=waited_s)]
    running = [Running("low", "bob", 8, ("n1",), LOW, preemptible, 0.0, preempting)]
    result = run_plan([], [node("n1")], lined=lined, running=running,
                      preempt_after_s=preempt_after_s)  # fmt: skip
    assert result.preemptions == ()


def test_a_victim_is_asked_once_and_what_it_frees_counts_for_the_line_behind() -> None:
    lined = [Lined("first", "alice", 4, ("n1",), HIGH, waited_s=600.0),
             Lined("second", "dave", 8, ("n1",), HIGH, waited_s=500.0)]  # fmt: skip
    running = [Running("new", "bob", 4, ("n1",), LOW, True, started=90.0),
               Running("old", "carol", 4, ("n1",), LOW, True, started=10.0)]  # fmt: skip
    result = run_plan([], [node("n1")], lined=lined, running=running)
    assert result.preemptions == (Preempt("new", "first", "n1"),)


def test_no_preemption_when_all_that_may_be_taken_would_not_be_enough() -> None:
    lined = [Lined("urgent", "alice", 8, ("n1",), HIGH, waited_s=600.0)]
    running = [Running("low", "bob", 4, ("n1",), LOW, True, 0.0),
               Running("peer", "carol", 4, ("n1",), HIGH, True, 0.0)]  # fmt: skip
    assert run_plan([], [node("n1")], lined=lined, running=running).preemptions == ()


def test_an_unknown_priority_is_refused_with_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="priority 3; a priority is an index of"):
        run_plan([queued("j", priority=3)], [node("n1")])


def test_decayed_usage_of_a_job_just_ended_and_one_still_running() -> None:
    usage = decayed_usage([("alice", 2, 0.0, HOUR), ("bob", 1, 0.0, None)], now=HOUR,
                          half_life_s=1e12)  # fmt: skip
    assert usage["alice"] == pytest.approx(2.0) and usage["bob"] == pytest.approx(1.0)
    assert decayed_usage([("carol", 4, 2 * HOUR, None)], now=HOUR) == {"carol": 0.0}
    ends_later = decayed_usage([("dave", 1, 0.0, 5 * HOUR)], now=HOUR, half_life_s=1e12)
    assert ends_later["dave"] == pytest.approx(1.0)  # what lies after now is not counted


# -- properties -------------------------------------------------------------------------------


@st.composite
def rounds(draw: st.DrawFn, crowded: bool = False) -> dict:
    """A random round: nodes, running and lined jobs on them, a queue, usage and quotas;
    ``crowded``: mostly low preemptible jobs running and high ones lined, as preemption needs."""
    sizes = draw(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=4))
    alive = draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    fleet = [
        node(f"n{i}", accels, alive=up or i == 0)
        for i, (accels, up) in enumerate(zip(sizes, alive, strict=True))
    ]
    ids = [n.node_id for n in fleet]
    owner, prio = st.sampled_from(OWNERS), st.integers(LOW, HIGH)
    on_nodes = st.lists(st.sampled_from(ids), min_size=1, max_size=2, unique=True).map(tuple)
    low, high = (st.integers(LOW, NORMAL), st.integers(NORMAL, HIGH)) if crowded else (prio, prio)
    mostly = st.integers(0, 4).map(bool) if crowded else st.booleans()
    running = [Running(f"r{i}", draw(owner), draw(st.integers(1, 4)), draw(on_nodes), draw(low),
                       draw(mostly), draw(st.floats(0, 1000)), not draw(mostly))
               for i in range(draw(st.integers(0, 8 if crowded else 5)))]  # fmt: skip
    lines = draw(st.integers(0, 6 if crowded else 4))
    lined = [Lined(f"l{i}", draw(owner), draw(st.integers(1, 8)), draw(on_nodes), draw(high),
                   draw(st.floats(0, 1000))) for i in range(lines)]  # fmt: skip
    queue = [Queued(f"q{i}", draw(owner), draw(st.integers(1, 8)), draw(st.integers(1, 2)),
                    draw(prio), draw(st.floats(0, 100)), draw(st.floats(0, 120)))
             for i in range(draw(st.integers(0, 12)))]  # fmt: skip
    quotas = draw(st.dictionaries(owner, st.integers(0, 16)))
    held = draw(st.dictionaries(owner, st.integers(0, 10)))
    usage = draw(st.dictionaries(owner, st.floats(0, 50)))
    return {"queue": queue, "nodes": fleet, "lined": lined, "running": running,
            "usage": usage, "quotas": quotas, "held": held}  # fmt: skip


def planned(case: dict, preempt_after_s: float | None = 300.0) -> Plan:
    return plan(
        case["queue"],
        case["nodes"],
        case["lined"],
        case["running"],
        case["usage"],
        case["quotas"],
        case["held"],
        patience_s=60.0,
        preempt_after_s=preempt_after_s,
    )


@given(rounds())
def test_assignments_never_exceed_a_quota(case: dict) -> None:
    result = planned(case)
    placed: dict[str, int] = defaultdict(int)
    for job in case["queue"]:
        if isinstance(result.decisions[job.job_id], Assign):
            placed[job.owner] += job.accels * job.nodes
    for owner, quota in case["quotas"].items():
        if placed[owner]:  # what an owner held before the round may already be over its quota
            assert case["held"].get(owner, 0) + placed[owner] <= quota


@given(rounds())
def test_a_higher_job_never_waits_for_room_a_lower_job_no_smaller_gets(case: dict) -> None:
    result = planned(case)
    assigned = [job for job in case["queue"] if isinstance(result.decisions[job.job_id], Assign)]
    for higher in case["queue"]:
        decision = result.decisions[higher.job_id]
        if isinstance(decision, Wait) and decision.reason.startswith("quota:"):
            continue
        for lower in assigned:
            if (lower.priority < higher.priority and lower.accels >= higher.accels
                    and lower.nodes >= higher.nodes):  # fmt: skip
                assert isinstance(decision, Assign), (higher, decision, lower)


@given(rounds(crowded=True))
def test_preemptions_take_only_lower_preemptible_jobs_of_others_each_once(case: dict) -> None:
    result = planned(case, preempt_after_s=100.0)
    running = {job.job_id: job for job in case["running"]}
    lined = {job.job_id: job for job in case["lined"]}
    victims = [preempt.victim for preempt in result.preemptions]
    assert len(victims) == len(set(victims))
    for preempt in result.preemptions:
        victim, waiting = running[preempt.victim], lined[preempt.for_job]
        assert victim.preemptible and not victim.preempting
        assert victim.priority < waiting.priority and victim.owner != waiting.owner
        assert waiting.waited_s >= 100.0
        assert preempt.node_id in victim.node_ids and preempt.node_id in waiting.node_ids
    assert planned(case, preempt_after_s=None).preemptions == ()


@given(rounds(), st.integers(1, 6), st.integers(1, 8), st.integers(1, 2), st.floats(0, 50))
def test_two_owners_of_equal_usage_with_identical_jobs_alternate(
    case: dict, count: int, accels: int, nodes: int, usage: float
) -> None:
    queue = [Queued(f"{owner}-{i}", owner, accels, nodes, HIGH, 7.0)
             for owner in ("alice", "bob") for i in range(count)]  # fmt: skip
    result = plan(queue, case["nodes"], case["lined"], case["running"],
                  {"alice": usage, "bob": usage}, {}, {}, 60.0, None)  # fmt: skip
    owners = [job_id.split("-")[0] for job_id in result.order]
    assert all(first != second for first, second in zip(owners, owners[1:], strict=False))


@dataclass
class Fleet:
    """A toy world in which planned jobs line up, start when their nodes are free, and end."""

    nodes: list[NodeCapacity]
    pending: dict[str, Queued]
    lined: dict[str, Lined] = field(default_factory=dict)
    running: dict[str, tuple[Running, int]] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    since: dict[str, int] = field(default_factory=dict)

    def round(self, now: int, quotas: dict[str, int], durations: dict[str, int]) -> Plan:
        held: dict[str, int] = defaultdict(int)
        holding: list[Lined | Running] = [*self.lined.values()]
        holding += [job for job, _ in self.running.values()]
        for holder in holding:
            held[holder.owner] += holder.accels * len(holder.node_ids)
        waited = {job_id: (now - since) * 10.0 for job_id, since in self.since.items()}
        queue = [Queued(j.job_id, j.owner, j.accels, j.nodes, j.priority, j.submitted,
                        waited[j.job_id]) for j in self.pending.values()]  # fmt: skip
        lined = [Lined(j.job_id, j.owner, j.accels, j.node_ids, j.priority, waited[j.job_id])
                 for j in self.lined.values()]  # fmt: skip
        result = plan(queue, self.nodes, lined, [job for job, _ in self.running.values()], {},
                      quotas, held, patience_s=1e9, preempt_after_s=30.0)  # fmt: skip
        for job_id, decision in result.decisions.items():
            job = self.pending[job_id]
            assert not isinstance(decision, Reject), (job, decision)
            if isinstance(decision, Assign):
                del self.pending[job_id]
                self.since[job_id] = now
                on = tuple(n.node_id for n in decision.nodes)
                self.lined[job_id] = Lined(job_id, job.owner, job.accels, on, job.priority, 0.0)
        for preempt in result.preemptions:
            if preempt.victim in self.running:
                victim, _ = self.running.pop(preempt.victim)
                self.pending[victim.job_id] = Queued(
                    victim.job_id, victim.owner, victim.accels, len(victim.node_ids),
                    victim.priority, now,
                )  # fmt: skip
                self.since[victim.job_id] = now
        self.start(now, durations)
        return result

    def start(self, now: int, durations: dict[str, int]) -> None:
        """Strict lines: in order of priority, then time lined, a job starts when all its nodes
        have its accelerators free and no job ahead of it waits there."""
        free = {n.node_id: n.accels for n in self.nodes}
        for holder, _ in self.running.values():
            for node_id in holder.node_ids:
                free[node_id] -= holder.accels
        blocked: set[str] = set()

        def place(job: Lined) -> tuple[int, int, str]:
            return -job.priority, self.since[job.job_id], job.job_id

        for job in sorted(self.lined.values(), key=place):
            if all(free[n] >= job.accels and n not in blocked for n in job.node_ids):
                for node_id in job.node_ids:
                    free[node_id] -= job.accels
                del self.lined[job.job_id]
                self.running[job.job_id] = (Running(job.job_id, job.owner, job.accels, job.node_ids,
                                                    job.priority, job.priority == LOW, float(now)),
                                            now + durations[job.job_id])  # fmt: skip
            else:
                blocked.update(job.node_ids)

    def finish(self, now: int) -> None:
        for job_id, (_, ends) in list(self.running.items()):
            if ends <= now:
                del self.running[job_id]
                self.done.add(job_id)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=3),
    st.lists(st.tuples(st.sampled_from(OWNERS), st.integers(1, 8), st.integers(1, 2),
                       st.integers(LOW, HIGH), st.integers(1, 3)), min_size=1, max_size=12),
    st.dictionaries(st.sampled_from(OWNERS), st.integers(2, 10)),
)  # fmt: skip
def test_every_feasible_job_runs_in_the_end(
    sizes: list[int], jobs: list[tuple[str, int, int, int, int]], quotas: dict[str, int]
) -> None:
    nodes = [node(f"n{i}", accels) for i, accels in enumerate(sizes)]
    feasible = {f"j{i}" for i, (owner, accels, count, _, _) in enumerate(jobs)
                if sum(n.accels >= accels for n in nodes) >= count
                and accels * count <= quotas.get(owner, accels * count)}  # fmt: skip
    assume(feasible)
    queue = {f"j{i}": Queued(f"j{i}", owner, accels, count, priority, float(i))
             for i, (owner, accels, count, priority, _) in enumerate(jobs)
             if f"j{i}" in feasible}  # fmt: skip
    durations = {f"j{i}": job[4] for i, job in enumerate(jobs)}
    world = Fleet(nodes, queue, since={job_id: 0 for job_id in queue})
    for now in range(400):
        world.round(now, quotas, durations)
        world.finish(now + 1)
        if world.done == feasible:
            break
    assert world.done == feasible, (world.pending, world.lined, world.running)


intervals_st = st.lists(
    st.tuples(st.sampled_from(OWNERS), st.integers(1, 8), st.floats(0, 10 * HOUR),
              st.floats(0, 5 * HOUR)),
    max_size=6,
)  # fmt: skip


@given(intervals_st, st.sampled_from(OWNERS), st.integers(1, 8), st.floats(0, 10 * HOUR),
       st.floats(1, 5 * HOUR))  # fmt: skip
def test_decayed_usage_is_monotone_in_what_was_used(
    intervals: list, owner: str, accels: int, start: float, length: float
) -> None:
    now = 20 * HOUR
    spans = [(o, a, s, s + d) for o, a, s, d in intervals]
    before = decayed_usage(spans, now)
    after = decayed_usage([*spans, (owner, accels, start, start + length)], now)
    longer = decayed_usage([*spans, (owner, accels, start - HOUR, start + length)], now)
    assert after[owner] > before.get(owner, 0.0)
    assert longer[owner] > after[owner]
    assert all(after[o] >= before[o] for o in before)


@given(st.integers(1, 8), st.floats(0, 48 * HOUR), st.floats(1, 48 * HOUR), st.floats(0, 48 * HOUR),
       st.sampled_from([HOUR, 86400.0]))  # fmt: skip
def test_decayed_usage_of_a_finished_job_halves_each_half_life_and_is_the_integral(
    accels: int, start: float, length: float, after_end: float, half_life: float
) -> None:
    end = start + length
    now = end + after_end
    first = decayed_usage([("alice", accels, start, end)], now, half_life)["alice"]
    later = decayed_usage([("alice", accels, start, end)], now + half_life, half_life)["alice"]
    assert later == pytest.approx(first / 2, rel=1e-9, abs=1e-12)
    steps = 4000
    width = length / steps
    numeric = sum(accels * 2 ** (-(now - (start + (k + 0.5) * width)) / half_life)
                  for k in range(steps)) * width / HOUR  # fmt: skip
    assert first == pytest.approx(numeric, rel=1e-5, abs=1e-12)
    assert not math.isnan(first)


def test_a_job_with_an_image_is_planned_onto_its_holder_and_one_without_is_not() -> None:
    image = "docker://registry.example.com/team/train:1"
    holder = NodeCapacity("holder", "holder", 8, busy_accels=4, alive=True, held=4,
                          images=frozenset({image}))  # fmt: skip
    with_image = Queued("pulls", "alice", 2, 1, NORMAL, 1.0, image=image)
    decided = run_plan([with_image, queued("plain", submitted=2.0)], [node("free"), holder])
    chosen = [decided.decisions[job] for job in ("pulls", "plain")]
    assert [d.node_name if isinstance(d, Assign) else d for d in chosen] == ["holder", "free"]
