"""Every hop over HTTPS, end to end on each store: `flexai server --tls-cert --tls-key` with a
certificate of a test CA; the agent on ``https://`` given the CA with ``--ca-file`` and its
client certificate (the server requires one of agents: ``--agent-client-ca``); the CLI with
``FLEXAI_CA_FILE``. A job runs, its log is followed, its checkpoint listed and its output
fetched; debug-ssh reaches it; the console signs in and shows its live log in Chromium; a
renewed certificate is served after SIGHUP while a follow that was open goes on; and a CLI that
does not trust the CA stops before any token reaches the server."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import zipfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.e2e.harness import FLEXAI, ROOT, Cluster, ServerCertificate, free_port, start_cluster
from tests.pg import fresh_database
from tests.support import wait_until
from tests.tls import TestCA, served_serial

pytestmark = pytest.mark.e2e
RepoFactory = Callable[[dict[str, str]], Path]

TRAIN = """\
import os, pathlib, time

checkpoints = pathlib.Path(os.environ["FLEXAI_OUTPUT_CHECKPOINT_DIR"])
ticks = int(os.environ.get("TICKS", "3"))
for tick in range(ticks):
    print(f"tick {tick}", flush=True)
    time.sleep(float(os.environ.get("PAUSE", "0")))
saved = checkpoints / "checkpoint-1"
saved.mkdir(parents=True)
(saved / "model.bin").write_bytes(b"weights" * 100)
(pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"]) / "result.txt").write_text("over https")
print("done", flush=True)
if os.environ.get("LINGER"):
    time.sleep(600)
"""


class Tls:
    """The test CA, the server's live certificate files (replaced to renew) and what signs."""

    def __init__(self, root: Path) -> None:
        self.ca = TestCA(root / "ca")
        first = self.ca.issue("first")
        self.live = ServerCertificate(root / "server.pem", root / "server.key", self.ca.path)
        self.serial = first.serial
        self.install(first.cert, first.key)
        self.agent = self.ca.issue("agent", ("test-node",), client=True)
        """The agent's client certificate: the server requires one (``--agent-client-ca``)."""

    def install(self, cert: Path, key: Path) -> None:
        shutil.copyfile(cert, self.live.cert)
        shutil.copyfile(key, self.live.key)
        self.live.key.chmod(0o600)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def secured(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[Cluster, Tls]]:  # fmt: skip
    root = tmp_path_factory.mktemp(f"tls-{request.param}")
    tls = Tls(root / "tls")
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        cluster = start_cluster(
            root / "cluster", database_url, tls=tls.live,
            server_flags=("--agent-client-ca", str(tls.ca.path)),
            agent_flags=("--client-cert", str(tls.agent.cert), "--client-key", str(tls.agent.key)),
        )  # fmt: skip
        stack.callback(cluster.stop)
        yield cluster, tls


@pytest.fixture
def cluster(secured: tuple[Cluster, Tls]) -> Cluster:
    return secured[0]


def run(cluster: Cluster, repo_factory: RepoFactory, name: str, *env: str) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": TRAIN})
    flags = [flag for item in env for flag in ("-E", item)]
    cluster.flexai("training", "run", name, "-u", str(repo), *flags, "--", "train.py")


def test_the_server_says_its_certificate_and_writes_an_https_client_config(
    cluster: Cluster, secured: tuple[Cluster, Tls]
) -> None:
    log = cluster.log("server")
    assert f"flexai server listening on {cluster.api_url} " in log
    assert "TLS certificate for 127.0.0.1, localhost, valid until " in log
    assert "without TLS" not in log
    config = json.loads((cluster.root / "config.json").read_text())
    assert config["api_url"] == cluster.api_url
    assert config["ca_file"] == str(secured[1].live.cert)
    nodes = cluster.api("GET", "/v1/nodes").json()["nodes"]
    assert [node["name"] for node in nodes if node["alive"]] == ["test-node"]  # over https


def test_a_job_is_run_followed_listed_and_fetched_over_https(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path
) -> None:
    run(cluster, repo_factory, job_name, "TICKS=5")
    followed = cluster.flexai("training", "logs", job_name, "--follow", timeout=180).stdout
    printed = [line for line in followed.splitlines() if not line.startswith("[")]  # [build]
    assert printed == [*(f"tick {n}" for n in range(5)), "done"]
    assert cluster.wait_for(job_name, {"succeeded"})["status"] == "succeeded"
    listed = json.loads(cluster.flexai("training", "checkpoints", job_name, "--json").stdout)
    checkpoints = listed["checkpoints"] if isinstance(listed, dict) else listed
    assert [checkpoint["name"] for checkpoint in checkpoints] == ["checkpoint-1"]
    cluster.flexai("training", "fetch", job_name, "-o", str(tmp_path))
    with zipfile.ZipFile(tmp_path / "output_0.zip") as archive:
        assert archive.read("result.txt") == b"over https"


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_debug_ssh_reaches_the_job_through_the_https_relay(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    run(cluster, repo_factory, job_name, "LINGER=1", "SOME_ENV=over-wss")
    try:
        cluster.wait_for(job_name, {"in progress"})
        wait_until(lambda: b"done" in cluster.api("GET", f"/v1/jobs/{job_name}/logs").content,
                   timeout=60)  # fmt: skip
        ran = cluster.flexai("training", "debug-ssh", job_name, "--", "sh", "-c",
                             "echo $SOME_ENV", timeout=90)  # fmt: skip
        assert ran.stdout.splitlines() == ["over-wss"]
    finally:
        cluster.flexai("training", "stop", job_name, check=False)


def requests_answered(cluster: Cluster, route: str) -> float:
    """The requests of ``route`` the server has answered (any method, any status), as its
    metrics count them."""
    text = cluster.api("GET", "/metrics").text
    counted = re.findall(r"^flexai_http_requests_total\{([^}]*)\} ([0-9.e+]+)$", text, re.M)
    return sum(float(value) for labels, value in counted if f'route="{route}"' in labels)


def test_a_cli_that_does_not_trust_the_ca_stops_before_sending_its_token(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"api_url": cluster.api_url, "token": cluster.token}))
    env = {**cluster.env, "FLEXAI_CONFIG": str(config)}
    env.pop("FLEXAI_CA_FILE")
    before = requests_answered(cluster, "/v1/jobs")
    said = subprocess.run([*FLEXAI, "training", "list"], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert requests_answered(cluster, "/v1/jobs") == before  # no request reached a route
    assert said.returncode == 1
    host = cluster.api_url.removeprefix("https://")
    assert said.stderr.startswith(f"error: the TLS certificate of {host} did not verify")
    assert "no token was sent" in said.stderr and "--ca-file FILE" in said.stderr

    ca = Path(cluster.env["FLEXAI_CA_FILE"])
    login = subprocess.run(  # a path relative to where it is run: kept absolute
        [*FLEXAI, "login", "--url", cluster.api_url, "--token-stdin", "--ca-file", ca.name],
        input=cluster.token, env=env, capture_output=True, text=True, timeout=60, cwd=ca.parent,
    )  # fmt: skip
    assert login.returncode == 0, login.stderr
    assert json.loads(config.read_text())["ca_file"] == str(ca.resolve())
    listed = subprocess.run([*FLEXAI, "training", "list"], env=env, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert listed.returncode == 0, listed.stderr


def test_agents_are_refused_without_a_client_certificate_of_the_agents_ca(
    secured: tuple[Cluster, Tls], tmp_path: Path
) -> None:
    cluster, tls = secured
    token_file = cluster.node_token_file("stray")
    agent = [*FLEXAI, "agent", "--server", cluster.api_url, "--ca-file", str(tls.ca.path),
             "--token-file", str(token_file), "--name", "stray", "--accels", "1",
             "--work-dir", str(tmp_path / "agent"),
             "--job-user", pwd.getpwuid(os.geteuid()).pw_name]  # fmt: skip
    env = {**cluster.env, "FLEXAI_CONFIG": str(tmp_path / "none.json")}
    refused = subprocess.run(agent, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert "client-certificate-needed" in refused.stderr or "client certificate" in refused.stderr
    assert "--client-cert FILE --client-key FILE" in refused.stderr

    other = TestCA(tmp_path / "other", "another CA").issue("stray", ("stray",), client=True)
    context = tls.ca.client_context()
    context.load_cert_chain(other.cert, other.key)
    with pytest.raises(httpx.TransportError):  # the handshake refuses it: no answer at all
        httpx.post(f"{cluster.api_url}/v1/agent/nodes/stray/heartbeat", json={},
                   headers={"Authorization": f"Bearer {token_file.read_text().strip()}"},
                   verify=context, timeout=10)  # fmt: skip
    names = [node["name"] for node in cluster.api("GET", "/v1/nodes").json()["nodes"]]
    assert "stray" not in names and "test-node" in names
    assert "agents must present a client certificate signed by" in cluster.log("server")


def test_sighup_serves_a_renewed_certificate_while_an_open_follow_goes_on(
    secured: tuple[Cluster, Tls], repo_factory: RepoFactory, job_name: str
) -> None:
    cluster, tls = secured
    port = int(cluster.api_url.rsplit(":", 1)[1])
    run(cluster, repo_factory, job_name, "TICKS=20", "PAUSE=0.3")
    cluster.wait_for(job_name, {"in progress"})
    lines: list[str] = []
    headers = {"Authorization": f"Bearer {cluster.token}"}
    with httpx.stream("GET", f"{cluster.api_url}/v1/jobs/{job_name}/logs",
                      params={"follow": "true"}, headers=headers, verify=cluster.verify,
                      timeout=httpx.Timeout(60, read=120)) as follow:  # fmt: skip
        stream = follow.iter_lines()
        while "tick 2" not in lines:
            lines.append(next(stream))
        old = served_serial("127.0.0.1", port, tls.ca)
        renewed = tls.ca.issue("renewed")
        tls.install(renewed.cert, renewed.key)
        cluster.parts["server"].send_signal(signal.SIGHUP)
        wait_until(lambda: served_serial("127.0.0.1", port, tls.ca) == renewed.serial, 20)
        assert old != renewed.serial
        lines.extend(stream)  # the same connection, to the job's end
    printed = [line for line in lines if not line.startswith("[")]  # not the [build] lines
    assert printed == [*(f"tick {n}" for n in range(20)), "done"]
    assert "SIGHUP: serving the TLS certificate for 127.0.0.1" in cluster.log("server")

    broken = tls.ca.issue("broken")  # a renewal caught half-written: its key is not there yet
    shutil.copyfile(broken.cert, tls.live.cert)
    cluster.parts["server"].send_signal(signal.SIGHUP)
    wait_until(lambda: "still serving the certificate loaded before" in cluster.log("server"), 20)
    assert served_serial("127.0.0.1", port, tls.ca) == renewed.serial
    assert cluster.parts["server"].poll() is None
    tls.install(renewed.cert, renewed.key)
    assert cluster.flexai("training", "list").returncode == 0


def test_the_console_signs_in_and_shows_a_live_log_over_https(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_ARGS, SLOW_S

    run(cluster, repo_factory, job_name, "TICKS=200", "PAUSE=0.3")
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                                 args=CHROMIUM_ARGS)  # fmt: skip
            context = browser.new_context(base_url=cluster.api_url, ignore_https_errors=True)
            page = context.new_page()
            answer = page.goto("/")
            assert answer is not None and answer.url.startswith("https://")
            page.get_by_label("API token").fill(cluster.token)
            page.get_by_role("button", name="Sign in").click()
            expect(page.get_by_text("Signed in as")).to_be_visible()
            [cookie] = context.cookies()
            assert cookie["secure"] is True and cookie["httpOnly"] is True
            page.goto(f"/jobs/{job_name}")
            expect(page.locator("#log")).to_contain_text("tick 3", timeout=SLOW_S)
            expect(page.locator("#log")).to_contain_text("tick 8", timeout=20_000)  # live
            browser.close()
    finally:
        cluster.flexai("training", "stop", job_name, check=False)
    signed_out = httpx.get(cluster.api_url + "/", verify=cluster.verify)
    assert signed_out.headers["strict-transport-security"] == "max-age=31536000"


def test_the_server_warns_when_it_listens_beyond_loopback_without_tls(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [*FLEXAI, "server", "--data-dir", str(tmp_path / "data"), "--host", "0.0.0.0",
         "--port", str(port), "--no-client-config"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        started = [server.stdout.readline() for _ in range(2)]
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/health"), 60)  # all said by then
    finally:
        server.send_signal(signal.SIGTERM)
        _, errors = server.communicate(timeout=30)
    assert any(line.startswith("flexai server listening on http://127.0.0.1:") for line in started)
    assert (
        "warning: listening on 0.0.0.0 without TLS: API tokens, secrets and logs cross the "
        "network in clear text" in errors
    )


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
