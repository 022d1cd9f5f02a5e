"""Secret masking of shipped logs: what it costs per byte, and what it holds back.

Feeds a synthetic training log (64 KiB chunks, as the shipper sends them) through
``SecretMask`` with one short value, one 2,000-byte value, and 20 values, and prints the
throughput as a ratio to the same log masked in one ``re.sub`` over all of it (the masking's
definition, and the fastest it could be), measured in the same run, repeats alternating.
It also prints how many bytes stay held back after a quiet job's last line: the point of the
streaming mask is that this is 0 when the line cannot begin a value.

    .venv/bin/python -m bench.masking [--megabytes 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time

from node_agent.logs.masking import MASK, SecretMask

CHUNK = 64 * 1024


def training_log(size: int, values: list[str], rng: random.Random) -> bytes:
    lines, total = [], 0
    step = 0
    while total < size:
        step += 1
        line = f"step {step} loss {rng.random():.6f} lr 3e-4 tokens/s {rng.randrange(10**6)}"
        if step % 500 == 0:
            line += f" key={rng.choice(values)}"
        lines.append(line + "\n")
        total += len(lines[-1])
    return "".join(lines).encode()


def streamed(data: bytes, values: list[str]) -> float:
    mask, started = SecretMask(values), time.perf_counter()
    for start in range(0, len(data), CHUNK):
        mask.feed(data[start : start + CHUNK])
    mask.feed(b"", final=True)
    return time.perf_counter() - started


def one_shot(data: bytes, values: list[str]) -> float:
    ordered = sorted({v.encode() for v in values}, key=len, reverse=True)
    pattern = re.compile(b"|".join(map(re.escape, ordered)))
    started = time.perf_counter()
    pattern.sub(MASK, data)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(1)
    cases = {
        "one 27-byte value": ["hf_" + "x7Kq" * 6],
        "one 2,000-byte value": ['{"type": "service_account", "key": "' + "k" * 1960 + '"}'],
        "20 values of 8-64 bytes": [f"tok{n}-" + "z" * rng.randrange(4, 60) for n in range(20)],
    }
    print(f"{'case':26} {'streamed MB/s':>14} {'one re.sub MB/s':>16} {'ratio':>6} {'held':>5}")
    for name, values in cases.items():
        data = training_log(args.megabytes * 1024 * 1024, values, rng)
        mine: list[float] = []
        base: list[float] = []
        for repeat in range(args.repeats):
            pair = (streamed, one_shot) if repeat % 2 == 0 else (one_shot, streamed)
            for measure in pair:
                (mine if measure is streamed else base).append(measure(data, values))
        size = len(data) / 1e6
        ours, theirs = statistics.median(mine), statistics.median(base)
        mask = SecretMask(values)
        mask.feed(b"step 9 loss 0.25 lr 3e-4 tokens/s 1234\n")
        print(f"{name:26} {size / ours:14.0f} {size / theirs:16.0f} {ours / theirs:6.2f} "
              f"{mask.held:5d}")  # fmt: skip


if __name__ == "__main__":
    main()
