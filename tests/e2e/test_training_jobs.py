"""A user's training jobs end to end: real server, real agent, real git, the real CLI."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.harness import Cluster
from tests.support import alive, build_wheel, job_pids, wait_until

pytestmark = pytest.mark.e2e
RepoFactory = Callable[[dict[str, str]], Path]

TRAIN = """\
import json, os, pathlib, sys
import tinydep

out = pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"])
checkpoints = pathlib.Path(os.environ["FLEXAI_OUTPUT_CHECKPOINT_DIR"])
print("devices", os.environ["CUDA_VISIBLE_DEVICES"], "greeting", os.environ.get("GREETING"))
print("args", " ".join(sys.argv[1:]), "dependency", tinydep.VALUE)
for step in (10, 20):
    partial = checkpoints / f".partial-{step}"
    partial.mkdir(parents=True)
    history = [{"step": step, "loss": 1.0 / step}, {"step": step, "eval_loss": 2.0 / step}]
    (partial / "trainer_state.json").write_text(
        json.dumps({"global_step": step, "log_history": history}))
    (partial / "config.json").write_text(
        json.dumps({"architectures": ["TinyNet"], "transformers_version": "4.46.0"}))
    (partial / "model.safetensors").write_bytes(bytes(16))
    partial.rename(checkpoints / f"checkpoint-{step}")
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
(out / "model.txt").write_text("final weights")
(out / "metrics").mkdir()
(out / "metrics" / "eval.json").write_text(json.dumps({"accuracy": 0.9}))
print("training finished")
"""


def history_statuses(document: dict[str, object]) -> list[str]:
    statuses: list[str] = []
    for entry in document["history"]:  # type: ignore[attr-defined]
        if not statuses or statuses[-1] != entry["status"]:
            statuses.append(entry["status"])
    return statuses


def test_a_job_runs_from_run_to_fetch_and_inspect_shows_each_status_with_its_time(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path
) -> None:
    build_wheel(cluster.root / "wheels", "tinydep", "1.0", "VALUE = 'installed'\n")
    repo = repo_factory({"requirements.txt": "tinydep==1.0\n", "train.py": TRAIN})

    run = cluster.flexai("training", "run", job_name, "-u", str(repo), "-E", "GREETING=hello",
                         "--", "train.py", "--lr", "0.1")  # fmt: skip
    assert job_name in run.stdout
    logs = cluster.flexai("training", "logs", job_name, "--follow").stdout

    inspected = json.loads(cluster.flexai("training", "inspect", job_name, "--json").stdout)
    assert inspected["status"] == "succeeded"
    assert history_statuses(inspected) == [
        "pending", "scheduling", "building", "in progress", "succeeded",
    ]  # fmt: skip
    assert all(entry["at"] for entry in inspected["history"])
    assert inspected["commit"] and len(inspected["commit"]) == 40
    assert "devices 0 greeting hello" in logs
    assert "args --lr 0.1 dependency installed" in logs
    job_lines = [line for line in logs.splitlines() if not line.startswith(("[build]", "[agent]"))]
    assert job_lines[-1] == "training finished"

    table = cluster.flexai("training", "checkpoints", job_name).stdout
    assert "checkpoint-20" in table and "TinyNet" in table
    checkpoints = json.loads(cluster.flexai("training", "checkpoints", job_name, "--json").stdout)
    rows = checkpoints["checkpoints"] if isinstance(checkpoints, dict) else checkpoints
    last = next(row for row in rows if row["name"] == "checkpoint-20")
    assert (last["step"], last["train_loss"], last["eval_loss"]) == (20, 0.05, 0.1)
    assert (last["model"], last["version"], last["inference_ready"]) == ("TinyNet", "4.46.0", True)

    cluster.flexai("training", "fetch", job_name, cwd=tmp_path)
    with zipfile.ZipFile(tmp_path / "output_0.zip") as archive:
        assert sorted(archive.namelist()) == ["metrics/eval.json", "model.txt"]
        assert archive.read("model.txt") == b"final weights"

    listed = cluster.flexai("training", "list").stdout
    assert job_name in listed and "succeeded" in listed


def test_an_unknown_revision_fails_saying_the_revision_was_not_found(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": "print('hi')\n"})
    cluster.flexai("training", "run", job_name, "-u", str(repo),
                   "--repository-revision", "no-such-branch", "--", "train.py")  # fmt: skip
    failed = cluster.wait_for(job_name, {"failed"})
    assert failed["failure"]["code"] == "revision_not_found"
    assert "no-such-branch" in failed["failure"]["message"]
    assert "not found" in failed["failure"]["message"]
    shown = cluster.flexai("training", "inspect", job_name).stdout
    assert "revision_not_found" in shown or "not found" in shown


def test_a_missing_requirements_file_fails_saying_so(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"train.py": "print('hi')\n"})
    cluster.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py")
    failed = cluster.wait_for(job_name, {"failed"})
    assert failed["failure"]["code"] == "requirements_not_found"
    assert "requirements.txt" in failed["failure"]["message"]


def test_an_entry_point_that_exits_with_3_fails_with_exit_code_3_in_the_reason(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": "print('bad'); raise SystemExit(3)\n"})
    cluster.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py")
    failed = cluster.wait_for(job_name, {"failed"})
    assert failed["failure"]["code"] == "entry_point_failed"
    assert "code 3" in failed["failure"]["message"]
    assert "bad" in cluster.flexai("training", "logs", job_name).stdout


def test_a_request_for_more_accelerators_than_any_node_has_is_rejected_with_the_reason(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": "print('hi')\n"})
    cluster.flexai("training", "run", job_name, "-u", str(repo), "--accels", "8", "--", "train.py")
    rejected = cluster.wait_for(job_name, {"rejected"})
    assert rejected["failure"]["code"] == "no_node_meets_request"
    assert "8 accelerators" in rejected["failure"]["message"]
    assert history_statuses(rejected) == ["pending", "scheduling", "rejected"]


STUBBORN = """\
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("running", flush=True)
time.sleep(600)
"""


def start_stubborn_job(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str, pid_file: Path
) -> list[int]:
    """Run a job whose entry point and its child sleep; return the pids on this host of its
    processes (in its sandbox, the shim's too) once it runs."""
    repo = repo_factory({"requirements.txt": "", "train.py": STUBBORN})
    cluster.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py")
    job_id = str(cluster.wait_for(job_name, {"in progress"})["id"])
    wait_until(lambda: "running" in cluster.flexai("training", "logs", job_name).stdout,
               timeout=60)  # fmt: skip
    wait_until(lambda: len(job_pids(job_id)) >= 3)  # the shim, the entry point, its child
    return job_pids(job_id)


def test_stop_while_in_progress_stops_the_job_and_its_processes(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path
) -> None:
    pids = start_stubborn_job(cluster, repo_factory, job_name, tmp_path / "pids")
    assert all(alive(pid) for pid in pids)

    cluster.flexai("training", "stop", job_name)
    stopped = cluster.wait_for(job_name, {"stopped"}, timeout=60)

    assert history_statuses(stopped)[-3:] == ["in progress", "stop in progress", "stopped"]
    assert stopped["stop"]["accelerators_allocated"] is True
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=10)


def test_delete_is_refused_while_running_and_frees_the_name_once_finished(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path
) -> None:
    start_stubborn_job(cluster, repo_factory, job_name, tmp_path / "pids")
    refused = cluster.flexai("training", "delete", job_name, check=False)
    assert refused.returncode != 0
    assert "stop" in refused.stderr and "Traceback" not in refused.stderr
    job_id = cluster.inspect(job_name)["id"]

    cluster.flexai("training", "stop", job_name)
    cluster.wait_for(job_name, {"stopped"}, timeout=60)
    cluster.flexai("training", "delete", job_name)

    assert job_name not in cluster.flexai("training", "list").stdout
    audit = cluster.api("GET", f"/v1/audit/jobs/{job_id}").json()
    assert [event["type"] for event in audit["events"]][-3:] == ["StopRequested", "Stopped",
                                                                  "Deleted"]  # fmt: skip
    named = cluster.api("GET", "/v1/audit/jobs", params={"name": job_name}).json()
    assert [job["id"] for job in named["jobs"] if job["deleted"]] == [job_id]

    quick = repo_factory({"requirements.txt": "", "train.py": "print('again')\n"})
    cluster.flexai("training", "run", job_name, "-u", str(quick), "--", "train.py")
    assert cluster.wait_for(job_name, {"succeeded"})["id"] != job_id


def test_run_refuses_a_name_in_use_and_a_name_that_breaks_the_rules(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": "print('hi')\n"})
    cluster.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py")

    taken = cluster.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py",
                           check=False)  # fmt: skip
    assert taken.returncode != 0
    assert "already" in taken.stderr and job_name in taken.stderr
    assert len(taken.stderr.strip().splitlines()) == 1

    for bad in ("ab", "-starts-with-dash", "has space", "x" * 64):
        refused = cluster.flexai("training", "run", bad, "-u", str(repo), "--", "train.py",
                                 check=False)  # fmt: skip
        assert refused.returncode != 0, bad
        assert "name" in refused.stderr.lower() and "Traceback" not in refused.stderr


def test_logs_follow_prints_every_one_of_20000_lines_the_last_included(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    flood = "for i in range(20000):\n    print(f'line {i:05d} ' + 'x' * 40)\n"
    repo = repo_factory({"requirements.txt": "", "train.py": flood})
    cluster.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py")

    followed = cluster.flexai("training", "logs", job_name, "--follow").stdout

    lines = [line for line in followed.splitlines() if line.startswith("line ")]
    assert len(lines) == 20000
    assert lines[0].startswith("line 00000") and lines[-1].startswith("line 19999")
    assert cluster.inspect(job_name)["status"] == "succeeded"


def test_a_job_waits_enqueued_while_the_accelerators_are_busy_then_runs(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path
) -> None:
    busy = f"{job_name}-busy"
    start_stubborn_job(cluster, repo_factory, busy, tmp_path / "pids")
    quick = repo_factory({"requirements.txt": "", "train.py": "print('my turn')\n"})
    cluster.flexai("training", "run", job_name, "-u", str(quick), "--", "train.py")
    cluster.wait_for(job_name, {"enqueued"})

    cluster.flexai("training", "stop", busy)
    done = cluster.wait_for(job_name, {"succeeded"}, timeout=60)

    assert history_statuses(done) == [
        "pending", "scheduling", "building", "enqueued", "in progress", "succeeded",
    ]  # fmt: skip
    assert cluster.inspect(busy)["stop"]["accelerators_allocated"] is True
    assert "my turn" in cluster.flexai("training", "logs", job_name).stdout


RESUME = """\
import os, pathlib
given = pathlib.Path(os.environ["FLEXAI_INPUT_CHECKPOINT_DIR"])
print("resumed from step", (given / "trainer_state.json").read_text().count("20"))
print("weights", len((given / "model.safetensors").read_bytes()))
print("dataset", (pathlib.Path(os.environ["FLEXAI_INPUT_DIR"]) / "tiny" / "rows.csv").read_text())
"""


def test_a_job_starts_from_another_jobs_checkpoint_and_reads_its_dataset(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    build_wheel(cluster.root / "wheels", "tinydep", "1.0", "VALUE = 'installed'\n")
    first = f"{job_name}-first"
    trained = repo_factory({"requirements.txt": "tinydep==1.0\n", "train.py": TRAIN})
    cluster.flexai("training", "run", first, "-u", str(trained), "--", "train.py")
    cluster.wait_for(first, {"succeeded"})
    dataset = cluster.root / "agent" / "datasets" / "tiny"
    dataset.mkdir(parents=True, exist_ok=True)
    (dataset / "rows.csv").write_text("x,y")

    resume = repo_factory({"requirements.txt": "", "train.py": RESUME})
    cluster.flexai("training", "run", job_name, "-u", str(resume), "-C", "checkpoint-20",
                   "-D", "tiny", "--", "train.py")  # fmt: skip
    cluster.wait_for(job_name, {"succeeded"})

    logs = cluster.flexai("training", "logs", job_name).stdout
    assert "weights 16" in logs and "dataset x,y" in logs


def test_run_refuses_an_unknown_checkpoint_with_what_to_do(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": "print('hi')\n"})
    missing = cluster.flexai("training", "run", job_name, "-u", str(repo), "-C", "nope",
                             "--", "train.py", check=False)  # fmt: skip
    assert missing.returncode == 1 and "checkpoints" in missing.stderr
    assert job_name not in cluster.flexai("training", "list").stdout
