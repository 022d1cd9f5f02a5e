"""The scheduling policy's round: what `domain.policy.plan` costs for 10,000 waiting jobs.

A fleet of 50 nodes of 8 accelerators, about half of each held by running jobs of 100 owners
and a few jobs lined up on each; 10,000 jobs waiting in ``scheduling`` (three priorities,
100 owners, 1 to 8 accelerators on 1 or 2 nodes, a quota for a third of the owners), and, in
the same run, the same fleet with only 100 jobs waiting. Each round is planned ``--repeats``
times, the two sizes alternating; median and p99 milliseconds of each are printed, and the
ratio of the large round's to the small one's (100x the jobs: a linear policy is at most about
100x, one that re-sorted per pick would be far above). Target: the large round well under 50 ms.

    .venv/bin/python -m bench.policy [--jobs 10000] [--small 100] [--repeats 200]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections import Counter

from domain.policy import Lined, Plan, Queued, Running, plan
from domain.scheduling import NodeCapacity

NODES, ACCELS, OWNERS = 50, 8, 100


def fleet(rng: random.Random) -> tuple[list[NodeCapacity], list[Running], list[Lined]]:
    """50 nodes of 8 accelerators, each with running jobs holding about half and a line."""
    nodes, running, lined = [], [], []
    for index in range(NODES):
        node_id = f"node-{index}"
        nodes.append(NodeCapacity(node_id, f"gpu-{index:02d}", ACCELS, 0, True, None, 0))
        held = 0
        while held < ACCELS // 2:
            accels = rng.choice((1, 2, 4))
            running.append(Running(f"run-{index}-{held}", f"user-{rng.randrange(OWNERS)}",
                                   accels, (node_id,), rng.randrange(3), rng.random() < 0.7,
                                   1e9 - rng.randrange(86400)))  # fmt: skip
            held += accels
        for place in range(rng.randrange(3)):
            lined.append(Lined(f"line-{index}-{place}", f"user-{rng.randrange(OWNERS)}",
                               rng.choice((2, 4, 8)), (node_id,), rng.randrange(3),
                               rng.uniform(0, 900)))  # fmt: skip
    return nodes, running, lined


def waiting(count: int, rng: random.Random) -> list[Queued]:
    return [
        Queued(
            f"job-{index:05d}",
            f"user-{rng.randrange(OWNERS)}",
            rng.choice((1, 2, 4, 8)),
            1 if rng.random() < 0.9 else 2,
            rng.randrange(3),
            1e9 - rng.uniform(0, 3600),
            rng.uniform(0, 120),
        )  # fmt: skip
        for index in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    rng = random.Random(7)
    nodes, running, lined = fleet(rng)
    usage = {f"user-{owner}": rng.uniform(0, 500) for owner in range(OWNERS)}
    quotas = {f"user-{owner}": rng.choice((8, 16, 32)) for owner in range(0, OWNERS, 3)}
    held: dict[str, int] = {}
    holders: list[Running | Lined] = [*running, *lined]
    for holder in holders:
        held[holder.owner] = held.get(holder.owner, 0) + holder.accels * len(holder.node_ids)
    rounds = {"large": waiting(args.jobs, rng), "small": waiting(args.small, rng)}
    times: dict[str, list[float]] = {name: [] for name in rounds}
    results: dict[str, Plan] = {}
    load = os.getloadavg()[0]
    for repeat in range(args.repeats):
        names = list(rounds) if repeat % 2 == 0 else list(rounds)[::-1]
        for name in names:
            started = time.perf_counter()
            results[name] = plan(rounds[name], nodes, lined, running, usage, quotas, held,
                                 patience_s=60.0, preempt_after_s=300.0)  # fmt: skip
            times[name].append((time.perf_counter() - started) * 1000)
    print(f"{'round':34} {'median ms':>10} {'p99 ms':>8}  decisions")
    for name, jobs in (("large", args.jobs), ("small", args.small)):
        ordered = sorted(times[name])
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        label = f"{jobs:,} queued, {OWNERS} owners, {NODES} nodes"
        kinds = Counter(type(decision).__name__ for decision in results[name].decisions.values())
        told = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
        print(f"{label:34} {statistics.median(ordered):10.2f} {p99:8.2f}  {told}, "
              f"preemptions: {len(results[name].preemptions)}")  # fmt: skip
    large = statistics.median(times["large"])
    ratio = large / statistics.median(times["small"])
    print(f"ratio of medians (large / small, {args.jobs // args.small}x the jobs): {ratio:.1f}x")
    verdict = "met" if large < 50 else "NOT met"
    print(f"target (large round's median under 50 ms): {verdict}; load average {load:.1f} "
          f"before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs")  # fmt: skip


if __name__ == "__main__":
    main()
