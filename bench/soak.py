"""A soak that kills every part of the control plane under load, and says what it lost.

N short training jobs (each writes a checkpoint half-way, resumes from it when run again, and
writes an output), every one with ``--max-retries``, are submitted through R server replicas
on one PostgreSQL and one S3 bucket, to A agents, while faults of each kind are injected on a
schedule (``--faults``, every ``--fault-every`` seconds for ``--duration`` seconds, the kinds
in turn): ``kill -9`` of a replica and of an agent, PostgreSQL restarted, the object store
killed (``bench/soak_parts.py`` says how each is done). The run ends once the faults are done
and every job is terminal. The report (``bench/soak_report.py``): submissions answered and
lost, jobs by status, failures by reason and kind, those of the infrastructure with retries
left (there must be none), retries used, `flexai admin verify --artifacts shallow`, a sample of
outputs fetched whole, tracebacks in the parts' logs, and how long it took. Exits 0 when the
run is clean.

Locally (the default) it starts everything itself: a throwaway database on the machine's
PostgreSQL (``FLEXAI_TEST_POSTGRES_URL``, as the tests), SeaweedFS, the replicas and agents:

    .venv/bin/python -m bench.soak                             # 200 jobs, ~2 minutes
    .venv/bin/python -m bench.soak --jobs 2000 --duration 900 --baseline  # the 15-minute soak
    .venv/bin/python -m bench.soak --faults agent,s3 --jobs 100 --json soak.json

``--baseline`` first runs the same jobs with no fault, and reports the soak's time as a ratio
to it. Against an operator's own deployment, name its replicas and how to kill each kind of
part (a command that kills it and returns once it is on its way back; kinds without one are
not injected):

    .venv/bin/python -m bench.soak --api-url https://cp-a:8000 --api-url https://cp-b:8000 \\
        --token-file admin.token --repository https://git.internal/ml/soak.git \\
        --fault agent="ssh gpu-01 'pkill -9 -f \"flexai agent\"; systemctl start flexai-agent'"

The repository there must hold this soak's ``train.py`` (``--print-train-py`` prints it).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.soak_parts import FAULT_KINDS, Fleet, local_fleet, remote_fleet
from bench.soak_report import (
    TERMINAL,
    Report,
    Submissions,
    every_job,
    failure_counts,
    outputs_whole,
    render,
    tracebacks,
    verify,
    write_json,
)
from common.contract import Status
from tests.support import make_repo

TRAIN_PY = '''\
import json, os, pathlib, time
steps, step_s = int(os.environ["SOAK_STEPS"]), float(os.environ["SOAK_STEP_S"])
given = pathlib.Path(os.environ["FLEXAI_INPUT_CHECKPOINT_DIR"]) / "state.json"
start = json.loads(given.read_text())["step"] if given.is_file() else 0
print(f"attempt {int(os.environ.get('FLEXAI_RESTART_COUNT', '0')) + 1} from step {start}")
for step in range(start, steps):
    time.sleep(step_s)
    print(f"step {step} loss {1 / (step + 1):.4f}", flush=True)
    if step == steps // 2:
        partial = pathlib.Path(os.environ["FLEXAI_OUTPUT_CHECKPOINT_DIR"]) / ".partial"
        partial.mkdir()
        (partial / "state.json").write_text(json.dumps({"step": step + 1}))
        partial.rename(partial.with_name(f"checkpoint-{step + 1}"))
output = pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"]) / "result.txt"
output.write_text(f"trained {steps} steps, from step {start}\\n")
print("done", flush=True)
'''
SUBMIT_PATIENCE_S = 300.0
"""How long one submission is sent again (no answer, a 5xx) before it counts as unanswered."""


@dataclass
class Run:
    prefix: str
    submissions: Submissions = field(default_factory=Submissions)
    faults: list[str] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0


class Soak:
    def __init__(self, fleet: Fleet, args: argparse.Namespace) -> None:
        self.fleet, self.args = fleet, args
        headers = {"Authorization": f"Bearer {fleet.token}"}
        self.clients = [httpx.Client(base_url=url, headers=headers, timeout=60)
                        for url in fleet.urls]  # fmt: skip
        self.kinds = [kind for kind in FAULT_KINDS if kind in args.faults]
        self.run_id = secrets.token_hex(3)

    def close(self) -> None:
        for client in self.clients:
            client.close()

    # -- talking to whichever replica answers -------------------------------------------

    def get(self, path: str, **params: Any) -> httpx.Response:
        """A read, from the first replica that answers (another while one is away)."""
        deadline, turn = time.monotonic() + SUBMIT_PATIENCE_S, 0
        while True:
            client = self.clients[turn % len(self.clients)]
            try:
                answer = client.get(path, params=params or None)
                if answer.status_code < 500:
                    return answer
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no replica answered GET {path} for {SUBMIT_PATIENCE_S} s")
            turn += 1
            time.sleep(0.2)

    def job_body(self, name: str) -> dict[str, Any]:
        return {"name": name, "repository_url": self.fleet.repository,
                "entry_point": ["train.py"], "max_retries": self.args.max_retries,
                "env": {"SOAK_STEPS": str(self.args.steps),
                        "SOAK_STEP_S": str(self.args.step_seconds)}}  # fmt: skip

    def submit(self, name: str, turn: int, submissions: Submissions) -> None:
        """Send one job, through the replicas in turn, until a replica answers it."""
        deadline, sent = time.monotonic() + SUBMIT_PATIENCE_S, 0
        while time.monotonic() < deadline:
            client = self.clients[(turn + sent) % len(self.clients)]
            sent += 1
            try:
                answer = client.post("/v1/jobs", json=self.job_body(name))
            except httpx.TransportError:
                answer = None
            if answer is not None and answer.status_code == 201:
                submissions.answered.append(name)
                return
            if answer is not None and answer.status_code == 409 and sent > 1:
                submissions.recorded_unanswered.append(name)  # an earlier send went in
                return
            if answer is not None and answer.status_code < 500:
                submissions.refused[name] = answer.text[:300]
                return
            submissions.resends += 1
            time.sleep(min(0.1 * sent, 2.0))
        submissions.unanswered.append(name)

    # -- one run ------------------------------------------------------------------------

    def warm_up(self) -> None:
        """One job per agent first: each node's git mirror and environment are made."""
        run = Run(f"warmup-{self.run_id}")
        for index in range(self.args.agents):
            self.submit(f"{run.prefix}-{index}", index, run.submissions)
        self.wait_terminal(run, time.monotonic() + self.args.settle)

    def run(self, label: str, faults: bool) -> Run:
        run = Run(f"{label}-{self.run_id}")
        run.started = time.monotonic()
        submitter = threading.Thread(target=self._submit_all, args=(run,), daemon=True)
        submitter.start()
        if faults and self.kinds:
            self._inject(run)
        submitter.join()
        self.wait_terminal(run, time.monotonic() + self.args.settle)
        run.ended = time.monotonic()
        return run

    def _submit_all(self, run: Run) -> None:
        gap = 1.0 / self.args.rate if self.args.rate else 0.0
        for index in range(self.args.jobs):
            if gap:
                time.sleep(max(0.0, run.started + index * gap - time.monotonic()))
            self.submit(f"{run.prefix}-{index}", index, run.submissions)

    def _inject(self, run: Run) -> None:
        """The faults, the kinds in turn, one every ``fault_every`` seconds (the first half a
        period in) for ``duration`` seconds."""
        every, count = self.args.fault_every, 0
        while (at := (count + 0.5) * every) < self.args.duration:
            time.sleep(max(0.0, run.started + at - time.monotonic()))
            kind = self.kinds[count % len(self.kinds)]
            began = time.monotonic() - run.started
            said = self.fleet.faults[kind](count // len(self.kinds))
            run.faults.append(f"{began:6.1f} s {kind}: {said}")
            print(f"  fault {run.faults[-1]}", flush=True)
            count += 1

    def wait_terminal(self, run: Run, deadline: float) -> None:
        live = [status for status in STATUSES if status not in TERMINAL]
        while time.monotonic() < deadline:
            rows = self.get("/v1/jobs", name_prefix=f"{run.prefix}-", limit=500,
                            status=live).json()["jobs"]
            if not rows:
                return
            time.sleep(1.0)

    # -- what it found ------------------------------------------------------------------

    def report(self, run: Run, baseline: float | None) -> Report:
        documents = every_job(self.clients[0], f"{run.prefix}-")
        by_name = {job["name"]: job for job in documents}
        failures, breaches = failure_counts(documents)
        ok, said = verify(self.fleet.config)
        checked, bad = outputs_whole(self.fleet.config, documents, self.args.fetch_sample,
                                     "result.txt", self.fleet.config.parent / "fetched")
        subs = run.submissions
        retried = [job for job in documents if job.get("retries_left", 0) < self.args.max_retries]
        return Report(
            jobs=self.args.jobs, duration_s=run.ended - run.started,
            submissions={"answered": len(subs.answered),
                         "recorded with their answer lost": len(subs.recorded_unanswered),
                         "refused": len(subs.refused), "unanswered": len(subs.unanswered),
                         "sent again": subs.resends},
            lost_submissions=[name for name in subs.answered if name not in by_name],
            statuses=dict(_count(job["status"] for job in documents)),
            not_terminal=[job["name"] for job in documents if job["status"] not in TERMINAL],
            failures=failures, failed_with_retries_left=breaches,
            retries_used=sum(self.args.max_retries - job.get("retries_left", 0)
                             for job in retried),
            jobs_retried=len(retried), verify_ok=ok, verify=said, outputs_checked=checked,
            outputs_bad=bad, tracebacks=tracebacks(self.fleet.logs), faults=run.faults,
            baseline_s=baseline,
        )  # fmt: skip


STATUSES = tuple(Status)


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--accels", type=int, default=4, help="accelerators per agent")
    parser.add_argument("--max-retries", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="each job's steps")
    parser.add_argument("--step-seconds", type=float, default=0.25)
    parser.add_argument("--rate", type=float, default=0.0,
                        help="jobs submitted per second (0: as fast as they are answered)")
    parser.add_argument("--faults", type=lambda v: [k for k in v.split(",") if k],
                        default=list(FAULT_KINDS),
                        help=f"the kinds to inject, in turn: {','.join(FAULT_KINDS)}")
    parser.add_argument("--fault-every", type=float, default=20.0, metavar="SECONDS")
    parser.add_argument("--duration", type=float, default=120.0, metavar="SECONDS",
                        help="how long faults are injected")
    parser.add_argument("--down", type=float, default=2.0,
                        help="seconds a killed replica stays down, and PostgreSQL")
    parser.add_argument("--agent-down", type=lambda v: [float(s) for s in v.split(",")],
                        default=[2.0, 10.0], metavar="SECONDS,...",
                        help="seconds a killed agent stays down, each in turn (local runs: "
                             "longer than 6 s, the server loses its node)")
    parser.add_argument("--s3-down", type=float, default=10.0)
    parser.add_argument("--postgres-restart", metavar="COMMAND",
                        help="restart PostgreSQL for real with this command (local runs; "
                             "e.g. 'pg_ctlcluster 15 main restart -m immediate')")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="passed to each local `flexai server` (repeatable)")
    parser.add_argument("--settle", type=float, default=600.0,
                        help="seconds to wait, after the faults, for every job to end")
    parser.add_argument("--fetch-sample", type=int, default=20)
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--dir", type=Path, help="where the local fleet lives (kept)")
    parser.add_argument("--api-url", action="append", default=[], help="a replica (remote)")
    parser.add_argument("--token-file", type=Path, help="an admin's token (remote)")
    parser.add_argument("--repository", help="the jobs' repository (remote: required)")
    parser.add_argument("--fault", action="append", default=[], metavar="KIND=COMMAND")
    parser.add_argument("--print-train-py", action="store_true")
    args = parser.parse_args(argv)
    unknown = set(args.faults) - set(FAULT_KINDS)
    if unknown:
        parser.error(f"unknown fault kinds {sorted(unknown)}: use {', '.join(FAULT_KINDS)}")
    if args.api_url and not (args.token_file and args.repository):
        parser.error("--api-url needs --token-file and --repository")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.print_train_py:
        print(TRAIN_PY, end="")
        return 0
    root = args.dir or Path(tempfile.mkdtemp(prefix="flexai-soak-"))
    with ExitStack() as stack:
        if args.api_url:
            commands = dict(item.split("=", 1) for item in args.fault)
            args.faults = [kind for kind in args.faults if kind in commands]
            fleet = remote_fleet(args.api_url, args.token_file.read_text().strip(),
                                 root / "config.json", commands, args.repository)  # fmt: skip
        else:
            repository = args.repository or str(make_repo(
                root / "repo", {"train.py": TRAIN_PY, "requirements.txt": ""}))  # fmt: skip
            print(f"soak: starting the fleet under {root}", flush=True)
            fleet = stack.enter_context(local_fleet(
                root / "fleet", replicas=args.replicas, agents=args.agents, accels=args.accels,
                down=args.down, agent_down=args.agent_down, s3_down=args.s3_down,
                postgres_restart=args.postgres_restart,
                server_args=args.server_arg, repository=repository))  # fmt: skip
        soak = Soak(fleet, args)
        stack.callback(soak.close)
        soak.warm_up()
        baseline = None
        if args.baseline:
            print(f"soak: {args.jobs} jobs without faults (the baseline)", flush=True)
            quiet = soak.run("baseline", faults=False)
            baseline = quiet.ended - quiet.started
        print(f"soak: {args.jobs} jobs, faults of {', '.join(soak.kinds) or 'no kind'} every "
              f"{args.fault_every:g} s for {args.duration:g} s", flush=True)  # fmt: skip
        run = soak.run("soak", faults=True)
        report = soak.report(run, baseline)
    print(render(report))
    if args.json:
        write_json(report, args.json)
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())
