"""Many users on one control plane, through the CLI (each store): an admin makes users, each
logs in with their own token, their jobs are their own (even under the same name), an admin
sees and acts on everyone's, and a revoked token stops working."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness import FLEXAI, Cluster
from tests.support import make_repo

pytestmark = pytest.mark.e2e


class Person:
    """One user's shell: their own client config (``flexai login`` writes it)."""

    def __init__(self, cluster: Cluster, config: Path) -> None:
        self.cluster = cluster
        self.env = {**cluster.env, "FLEXAI_CONFIG": str(config)}
        self.config = config

    def flexai(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*FLEXAI, *args], env=self.env, input=stdin, capture_output=True, text=True,
            timeout=120, cwd=self.cluster.root,
        )  # fmt: skip

    def ok(self, *args: str, stdin: str | None = None) -> str:
        result = self.flexai(*args, stdin=stdin)
        assert result.returncode == 0, f"flexai {' '.join(args)}: {result.stderr}"
        return result.stdout

    def refused(self, *args: str) -> str:
        result = self.flexai(*args)
        assert result.returncode == 1, f"flexai {' '.join(args)}: {result.stdout}"
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        return result.stderr


def test_users_log_in_keep_their_jobs_apart_and_an_admin_sees_them_all(
    cluster: Cluster, tmp_path: Path, job_name: str
) -> None:
    admin = Person(cluster, cluster.root / "config.json")
    people = {}
    for name in (f"{job_name}-a", f"{job_name}-b"):
        user = name.replace("t-", "u")
        token = admin.ok("admin", "user", "create", user).strip()
        person = Person(cluster, tmp_path / f"{user}.json")
        said = person.ok("login", "--url", cluster.api_url, "--token-stdin", stdin=token)
        assert f"as {user}" in said
        assert stat.S_IMODE(os.stat(person.config).st_mode) == 0o600
        assert person.ok("whoami").startswith(f"{user} (token ")
        people[user] = person
    (alice_name, alice), (bob_name, bob) = people.items()

    repo = make_repo(tmp_path / "repo", {"requirements.txt": "", "train.py": "print('hi')\n"})
    for person in (alice, bob):  # the same name: names are unique per owner
        person.ok("training", "run", "train-1", "-u", str(repo), "--", "train.py")
    assert "train-1" in alice.ok("training", "list")
    alice_job = alice.ok("training", "inspect", "train-1", "--json")
    bob_job = bob.ok("training", "inspect", "train-1", "--json")
    assert alice_name in alice_job and bob_name in bob_job and alice_job != bob_job

    # Bob cannot reach Alice's job, not even by naming her; the admin can.
    assert "admin" in bob.refused("training", "stop", "train-1", "--owner", alice_name)
    assert "admin" in bob.refused("training", "list", "--all-users")
    every = admin.ok("training", "list", "--all-users")
    assert every.splitlines()[0].startswith("OWNER")
    owners = {line.split()[0] for line in every.splitlines()[1:] if " train-1 " in line}
    assert owners == {alice_name, bob_name}
    assert alice_name in admin.ok("training", "inspect", "train-1", "--owner", alice_name, "--json")
    assert "no job named 'train-1'" in admin.refused("training", "inspect", "train-1")

    # Alice's token list shows ids, never values; a revoked token stops working at once.
    listed = alice.ok("admin", "token", "list")
    token_id = listed.splitlines()[1].split()[0]
    assert alice.ok("admin", "token", "revoke", token_id).startswith(f"revoked token {token_id}")
    refused = alice.refused("training", "list")
    assert "revoked" in refused and "flexai login" in refused
    assert "admin" in bob.refused("admin", "user", "list")
    assert alice_name in admin.ok("admin", "user", "list")
