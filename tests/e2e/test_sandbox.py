"""Every job in a sandbox of its own, end to end (real server and agent processes, each store),
the agent deployed as the README says: root, no --job-user. Alice runs a job with a secret and
Bob one beside it on the same node: Bob's job runs as another id, sees none of Alice's
processes, cannot read her environment, her files (through /proc/<pid>/cwd too) or her /tmp,
cannot signal her processes, and her secret is nowhere in his log. A FlexAI-style script runs
unchanged: it reads /input/<dataset> and /input-checkpoint, writes /output-checkpoint/
checkpoint-N and a final model at the root of /output-checkpoint, and `checkpoints` lists the
root one as the job's final checkpoint, with its model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.harness import FLEXAI, Cluster, start_cluster
from tests.pg import fresh_database
from tests.support import make_repo, python_for_user

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                       reason="sandboxes need root and bubblewrap"),  # fmt: skip
]

ALICE = """\
import os, pathlib, time
pathlib.Path("/tmp/alice-notes").write_text(os.environ["HF"])
pathlib.Path("/output/model.txt").write_text("alice's weights")
print("alice runs as", os.getuid(), flush=True)
while not pathlib.Path("/output/done").exists() and time.sleep(0.2) is None:
    if time.monotonic() - START > 60:
        break
"""

BOB = """\
import json, os, pathlib, signal, time
time.sleep(2)
seen = {"uid": os.getuid(), "pids": [], "environ": [], "cwd": [], "killed": [], "tmp": None}
for name in os.listdir("/proc"):
    if name.isdigit():
        pid = int(name)
        seen["pids"].append(pid)
        for key, path in (("environ", f"/proc/{pid}/environ"),
                          ("cwd", f"/proc/{pid}/cwd/train.py")):
            try:
                seen[key].append(pathlib.Path(path).read_bytes()[:200].decode(errors="replace"))
            except OSError:
                pass
for pid in range(1, 400000, 997):  # every pid it might guess: none is Alice's here
    try:
        os.kill(pid, 0)
        seen["killed"].append(pid)
    except OSError:
        pass
try:
    seen["tmp"] = pathlib.Path("/tmp/alice-notes").read_text()
except OSError as error:
    seen["tmp"] = type(error).__name__
print("SEEN " + json.dumps(seen), flush=True)
"""

FLEXAI_STYLE = """\
import json, os, pathlib
data = pathlib.Path("/input/corpus/lines.txt").read_text().split()
before = json.loads(pathlib.Path("/input-checkpoint/state.json").read_text())["step"]
step = pathlib.Path("/output-checkpoint/checkpoint-{}".format(before + 1))
step.mkdir()
(step / "state.json").write_text(json.dumps({"step": before + 1}))
final = pathlib.Path("/output-checkpoint")
(final / "config.json").write_text(json.dumps({"architectures": ["TinyLM"],
                                               "transformers_version": "4.46.0"}))
(final / "model.safetensors").write_bytes(b"weights" * 100)
pathlib.Path("/output/words.txt").write_text(str(len(data)))
print("trained on", len(data), "words from step", before, flush=True)
"""

SEED = """\
import json, pathlib
step = pathlib.Path("/output-checkpoint/checkpoint-4")
step.mkdir()
(step / "state.json").write_text(json.dumps({"step": 4}))
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Cluster]:  # fmt: skip
    python = python_for_user("nobody")
    if python is None:
        pytest.skip("no Python interpreter here that another user can run with venv and pip")
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        cluster = start_cluster(tmp_path_factory.mktemp(f"sandbox-{request.param}"),
                                database_url, accels=2, job_user="", job_python=python)
        stack.callback(cluster.stop)
        yield cluster


class Person:
    def __init__(self, cluster: Cluster, name: str, root: Path) -> None:
        token = cluster.flexai("admin", "user", "create", name).stdout.strip()
        self.cluster, self.name = cluster, name
        self.env = {**cluster.env, "FLEXAI_CONFIG": str(root / f"{name}.json")}
        self.run("login", "--url", cluster.api_url, "--token-stdin", stdin=token)

    def run(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run([*FLEXAI, *args], env=self.env, input=stdin, capture_output=True,
                              text=True, timeout=120, cwd=self.cluster.root)  # fmt: skip
        assert done.returncode == 0, f"flexai {' '.join(args)}: {done.stderr}"
        return done.stdout

    def wait_for(self, name: str, statuses: set[str]) -> dict[str, object]:
        import time

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            job: dict[str, object] = json.loads(self.run("training", "inspect", name, "--json"))
            if job["status"] in statuses:
                return job
            time.sleep(0.3)
        raise AssertionError(f"{name} never reached {statuses}: {job}")


def test_two_users_jobs_on_one_node_cannot_read_signal_or_see_each_other(
    fleet: Cluster, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    alice, bob = Person(fleet, f"alice{tag}", tmp_path), Person(fleet, f"bob{tag}", tmp_path)
    value = f"hf-{uuid.uuid4().hex}"
    alice.run("secret", "create", "hf-token", stdin=value + "\n")
    repo_a = make_repo(tmp_path / "a", {"train.py": "import time\nSTART = time.monotonic()\n"
                                        + ALICE, "requirements.txt": ""})  # fmt: skip
    repo_b = make_repo(tmp_path / "b", {"train.py": BOB, "requirements.txt": ""})
    alice.run("training", "run", "private", "-u", str(repo_a), "-S", "HF=hf-token", "--",
              "train.py")  # fmt: skip
    alice.wait_for("private", {"in progress"})
    bob.run("training", "run", "prying", "-u", str(repo_b), "--", "train.py")
    bob.wait_for("prying", {"succeeded"})
    log = bob.run("training", "logs", "prying")
    seen = json.loads(next(line[5:] for line in log.splitlines() if line.startswith("SEEN ")))
    alice_log = alice.run("training", "logs", "private")
    alice_uid = int(alice_log.split("alice runs as ")[1].split()[0])
    assert seen["uid"] != alice_uid and seen["uid"] != 0
    assert len(seen["pids"]) <= 3  # its shim and itself: Alice's processes are not there
    assert not any(value in text or "alice" in text for text in seen["environ"] + seen["cwd"])
    assert seen["killed"] == [1] or seen["killed"] == []  # its own shim at most
    assert seen["tmp"] == "FileNotFoundError"
    assert value not in log
    alice.run("training", "stop", "private")
    node = json.loads(fleet.flexai("admin", "node", "list", "--json").stdout)["nodes"][0]
    assert node["isolation"]["level"] == "sandbox"
    shown = fleet.flexai("admin", "node", "list").stdout
    assert "sandbox" in shown.splitlines()[1]


def test_a_flexai_style_script_runs_unchanged_and_its_final_checkpoint_is_listed(
    fleet: Cluster, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "lines.txt").write_text("the quick brown fox jumps\n")
    name = f"corpus{uuid.uuid4().hex[:6]}"
    fleet.flexai("dataset", "push", name, str(corpus))
    seed, job = f"seed-{uuid.uuid4().hex[:6]}", f"fx-{uuid.uuid4().hex[:6]}"
    fleet.flexai("training", "run", seed, "-u", str(make_repo(tmp_path / "seed", {
        "train.py": SEED, "requirements.txt": ""})), "--", "train.py")  # fmt: skip
    fleet.wait_for(seed, {"succeeded"})
    checkpoint = json.loads(fleet.flexai("training", "checkpoints", seed, "--json").stdout)
    repo = make_repo(tmp_path / "flexai", {"train.py": FLEXAI_STYLE, "requirements.txt": ""})
    fleet.flexai("training", "run", job, "-u", str(repo), "-D", f"{name}=corpus", "-C",
                 checkpoint["checkpoints"][0]["id"], "--", "train.py")  # fmt: skip
    done = fleet.wait_for(job, {"succeeded", "failed"})
    assert done["status"] == "succeeded", fleet.flexai("training", "logs", job).stdout
    assert "trained on 5 words from step 4" in fleet.flexai("training", "logs", job).stdout
    listed = json.loads(fleet.flexai("training", "checkpoints", job, "--json").stdout)
    by_name = {entry["name"]: entry for entry in listed["checkpoints"]}
    assert set(by_name) == {"checkpoint-5", ""}
    assert by_name[""]["model"] == "TinyLM" and by_name[""]["inference_ready"] is True
    table = fleet.flexai("training", "checkpoints", job).stdout
    assert "(final)" in table and "TinyLM" in table
