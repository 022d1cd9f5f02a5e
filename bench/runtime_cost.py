"""What a runtime costs a job from `run` to `succeeded` once its image is in the node's cache.

One real server and agent (``--insecure-registry`` for a registry on loopback: Debian's
``docker-registry`` with htpasswd, ``tests/registry.py``), an image made with ``umoci`` and
pushed with ``skopeo``, a runtime naming it with a registry secret. After one warm-up job of
each kind (the first runtime job pulls the image), jobs on ``host`` and on the runtime
alternate, and each is timed from its ``POST /v1/jobs`` to ``succeeded`` (target: the runtime
adds at most 50 ms to the p50).

What it covers today: the build asks the registry for the tag's digest (``skopeo inspect``) and
finds the image in the cache; the entry point does not run inside the image yet.

    .venv/bin/python -m bench.runtime_cost --store sqlite --jobs 20
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.e2e import POLL_S, Flexai, flexai, percentile
from tests.registry import make_image, missing_tools, push, running_registry
from tests.support import make_repo

TARGET_S = 0.050
RUNTIME = "bench-runtime"


def submit(cluster: Flexai, repo: Path, runtime: str | None) -> tuple[str, float]:
    cluster.counter += 1
    name = f"bench-{cluster.counter}"
    body = {"name": name, "repository_url": str(repo), "entry_point": ["train.py"]}
    answer = cluster.http.post("/v1/jobs", json={**body, **({"runtime": runtime} if runtime
                                                           else {})})  # fmt: skip
    returned = time.perf_counter()
    if answer.status_code != 201:
        raise RuntimeError(f"submission refused: {answer.status_code} {answer.text}")
    return name, returned


def measure(store: str, jobs: int, folder: Path) -> tuple[list[float], list[float]]:
    with running_registry(folder / "registry") as registry:
        push(make_image(folder / "layout", {"/etc/os-release": "ID=bench\n"}), registry,
             "bench/img:1")  # fmt: skip
        agent_args = ("--insecure-registry", registry.address)
        with flexai(store, folder / f"cluster-{store}", 1, 1, agent_args) as cluster:
            made = cluster.http.post("/v1/secrets", json={"name": "registry-login",
                                                           "value": registry.credentials})
            made.raise_for_status()
            cluster.http.post("/v1/admin/runtimes", json={
                "name": RUNTIME, "image": registry.reference("bench/img:1"),
                "registry_secret": "registry-login"}).raise_for_status()  # fmt: skip
            repo = make_repo(folder / "repo", {"train.py": "pass\n", "requirements.txt": ""})
            for runtime in (None, RUNTIME):  # warm-up: the mirror, the environment, the pull
                cluster.wait_succeeded(submit(cluster, repo, runtime)[0])
            host: list[float] = []
            image: list[float] = []
            for _ in range(jobs):
                for runtime, taken in ((None, host), (RUNTIME, image)):
                    name, returned = submit(cluster, repo, runtime)
                    taken.append(cluster.wait_succeeded(name, poll=POLL_S) - returned)
            return host, image


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--jobs", type=int, default=20, help="timed jobs of each kind (20)")
    args = parser.parse_args(argv)
    missing = missing_tools()
    if missing:
        print(f"needs {', '.join(missing)}: apt-get install -y {' '.join(missing)}")
        return 2
    with tempfile.TemporaryDirectory(prefix="flexai-bench-runtime-") as tmp:
        host, image = measure(args.store, args.jobs, Path(tmp))
    added = statistics.median(image) - statistics.median(host)
    for label, timings in (("host", host), (f"runtime {RUNTIME} (cached)", image)):
        print(f"{label:32} p50 {percentile(timings, 50) * 1000:7.1f} ms   "
              f"p90 {percentile(timings, 90) * 1000:7.1f} ms")  # fmt: skip
    print(f"the cached runtime adds {added * 1000:+.1f} ms to the p50 "
          f"({statistics.median(image) / statistics.median(host):.2f}x; target <= "
          f"+{TARGET_S * 1000:.0f} ms: {'met' if added <= TARGET_S else 'NOT met'})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
