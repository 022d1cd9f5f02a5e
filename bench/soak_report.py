"""What a soak found (``bench/soak.py``), read back from the fleet it ran on: every job the run
submitted, whether each answered submission is in the ledger, how each job ended and whose
failure it was, the retries spent, whether `flexai admin verify` finds the ledger and its
artifacts whole, whether a sample of outputs fetches whole, and any traceback in a part's log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from common.contract import TERMINAL as CONTRACT_TERMINAL
from common.contract import Status

TERMINAL = {str(status) for status in CONTRACT_TERMINAL}
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Submissions:
    """How each submission went: answered (201), recorded though its answer was lost (a
    resend found the name taken), refused (another 4xx), or never answered at all."""

    answered: list[str] = field(default_factory=list)
    recorded_unanswered: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    unanswered: list[str] = field(default_factory=list)
    resends: int = 0
    """Submissions sent again after no answer or a 5xx."""


@dataclass
class Report:
    jobs: int
    duration_s: float
    submissions: dict[str, int]
    lost_submissions: list[str]
    statuses: dict[str, int]
    not_terminal: list[str]
    failures: dict[str, int]
    """``code (kind)``: how many jobs ended so."""
    failed_with_retries_left: list[str]
    """Jobs that failed for the infrastructure with retries left: the invariant's breaches."""
    retries_used: int
    jobs_retried: int
    verify_ok: bool
    verify: str
    outputs_checked: int
    outputs_bad: list[str]
    tracebacks: dict[str, int]
    faults: list[str]
    baseline_s: float | None = None

    @property
    def clean(self) -> bool:
        """Nothing lost, nothing left running, no infrastructure failure with retries left,
        the ledger and artifacts whole, every output whole, no traceback."""
        return not (self.lost_submissions or self.not_terminal or self.failed_with_retries_left
                    or not self.verify_ok or self.outputs_bad or self.tracebacks)  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "clean": self.clean}


def every_job(client: httpx.Client, prefix: str) -> list[dict[str, Any]]:
    """Each job whose name starts with ``prefix``, as ``GET /v1/jobs/{name}`` shows it."""
    names, cursor = [], None
    while True:
        params: dict[str, Any] = {"name_prefix": prefix, "limit": 500}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/jobs", params=params)
        page.raise_for_status()
        names += [row["name"] for row in page.json()["jobs"]]
        cursor = page.json().get("next_cursor")
        if not cursor:
            break
    documents = []
    for name in names:
        answer = client.get(f"/v1/jobs/{name}")
        answer.raise_for_status()
        documents.append(answer.json())
    return documents


def failure_counts(documents: list[dict[str, Any]]) -> tuple[dict[str, int], list[str]]:
    """Failures by ``code (kind)``, and the jobs failed for the infrastructure though they had
    retries left."""
    counts: Counter[str] = Counter()
    breaches = []
    for job in documents:
        failure = job.get("failure")
        if job["status"] not in ("failed", "rejected", Status.STOP_FAILED) or not failure:
            continue
        counts[f"{failure['code']} ({failure.get('kind') or '-'})"] += 1
        if failure.get("kind") == "infrastructure" and job.get("retries_left", 0) > 0:
            breaches.append(job["name"])
    return dict(counts), breaches


def _flexai(config: Path, *args: str, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    env = {**os.environ, "FLEXAI_CONFIG": str(config), "PYTHONPATH": str(ROOT)}
    env.pop("FLEXAI_API_URL", None)
    env.pop("FLEXAI_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "cli.main", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def verify(config: Path) -> tuple[bool, str]:
    """`flexai admin verify --artifacts shallow` through the CLI, as an operator runs it."""
    done = _flexai(config, "admin", "verify", "--artifacts", "shallow")
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def outputs_whole(config: Path, documents: list[dict[str, Any]], sample: int, expect: str,
                  into: Path) -> tuple[int, list[str]]:  # fmt: skip
    """`flexai training fetch` the outputs of up to ``sample`` succeeded jobs (the retried
    ones first), as a user does: each must come whole (the CLI checks its SHA-256) and hold
    ``expect``."""
    succeeded = [job for job in documents if job["status"] == "succeeded"]
    succeeded.sort(key=lambda job: -int(job.get("attempt") or 1))
    bad = []
    for job in succeeded[:sample]:
        target = into / job["name"]
        target.mkdir(parents=True, exist_ok=True)
        done = _flexai(config, "training", "fetch", job["name"], cwd=target)
        try:
            with zipfile.ZipFile(target / "output_0.zip") as archive:
                if archive.testzip() is not None or not any(
                    name.endswith(expect) for name in archive.namelist()
                ):  # fmt: skip
                    bad.append(f"{job['name']}: {archive.namelist()}")
        except (OSError, zipfile.BadZipFile) as error:
            bad.append(f"{job['name']}: {error}; {done.stderr.strip()[-300:]}")
    return min(sample, len(succeeded)), bad


def tracebacks(logs: list[Path]) -> dict[str, int]:
    found = {}
    for log in logs:
        if log.exists() and (count := log.read_bytes().count(b"Traceback (most recent call")):
            found[str(log)] = count
    return found


def render(report: Report) -> str:
    """The report as an operator reads it."""
    lines = [f"soak: {report.jobs} jobs in {report.duration_s:.0f} s"
             + (f" ({report.duration_s / report.baseline_s:.2f}x the {report.baseline_s:.0f} s "
                "the same jobs took without faults)" if report.baseline_s else "")]  # fmt: skip
    lines.append(f"faults: {len(report.faults)}")
    lines += [f"  {fault}" for fault in report.faults]
    lines.append("submissions: " + ", ".join(f"{v} {k}" for k, v in report.submissions.items()))
    lines.append(f"lost answered submissions: {len(report.lost_submissions)}"
                 + (f" ({', '.join(report.lost_submissions[:10])})"
                    if report.lost_submissions else ""))  # fmt: skip
    lines.append("statuses: " + ", ".join(f"{v} {k}" for k, v in sorted(report.statuses.items())))
    lines.append(f"not terminal: {len(report.not_terminal)}"
                 + (f" ({', '.join(report.not_terminal[:10])})" if report.not_terminal else ""))
    for failure, count in sorted(report.failures.items()):
        lines.append(f"  failed: {count} {failure}")
    lines.append(f"failed for the infrastructure with retries left: "
                 f"{len(report.failed_with_retries_left)}"
                 + (f" ({', '.join(report.failed_with_retries_left[:10])})"
                    if report.failed_with_retries_left else ""))  # fmt: skip
    lines.append(f"retries used: {report.retries_used} by {report.jobs_retried} jobs")
    lines.append(f"admin verify: {'ok' if report.verify_ok else 'FAILED'}")
    if not report.verify_ok:
        lines += [f"  {line}" for line in report.verify.splitlines()[:20]]
    lines.append(f"outputs fetched whole: {report.outputs_checked - len(report.outputs_bad)} "
                 f"of {report.outputs_checked}")  # fmt: skip
    lines += [f"  {bad}" for bad in report.outputs_bad[:10]]
    lines.append(f"tracebacks in the parts' logs: {sum(report.tracebacks.values())}")
    lines += [f"  {log}: {count}" for log, count in report.tracebacks.items()]
    lines.append("clean: " + ("yes" if report.clean else "NO"))
    return "\n".join(lines)


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps(report.as_json(), indent=2))
