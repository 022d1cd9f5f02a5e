"""``flexai agent``: run this host's node agent in the foreground until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.client_config import ConfigError, load_client_config
from common.tls import TlsConfigError, check_url
from node_agent import workdir
from node_agent.accelerators import detect_gpus, device_nodes
from node_agent.agent import Agent, AgentSettings
from node_agent.build.envcache import host_site_packages
from node_agent.client import ApiError, ApiUnavailable, ControlPlaneClient, NodeTaken
from node_agent.credentials import CredentialError, token_from_environment, token_from_file
from node_agent.images.flags import add_flags as add_image_flags
from node_agent.images.flags import image_settings
from node_agent.network import default_address
from node_agent.run.jobuser import (
    JobUser,
    JobUserError,
    check_can_build,
    job_user,
    shared_user_warning,
)
from node_agent.sandbox.setup import add_flags as add_sandbox_flags
from node_agent.sandbox.setup import sandboxes
from node_agent.supervisor import SupervisorSettings
from node_agent.workdir import WorkDirError

log = logging.getLogger("flexai.agent")

DEFAULT_WORK_DIR = Path("~/.local/share/flexai/agent")


class AgentError(Exception):
    """An expected failure: one line on stderr, exit code 1."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flexai agent",
        description="Run a node agent: offer this host's accelerators to the control plane "
        "and run the training jobs it assigns here.",
    )
    add = parser.add_argument
    add("--server", metavar="URL", help="the control plane's URL (default: the client config)")
    add(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="a file (mode 0600) holding the API token (default: FLEXAI_TOKEN, else the client "
        "config); never the token itself on the command line, where `ps` shows it to all",
    )
    add("--token", help=argparse.SUPPRESS)  # refused: see main()
    add(
        "--ca-file",
        type=Path,
        metavar="FILE",
        help="a private CA's certificate (PEM) to verify the control plane's https:// with, "
        "besides the system's CAs (default: FLEXAI_CA_FILE, else the client config's)",
    )
    add(
        "--allow-http",
        action="store_true",
        help="talk plain http:// to a control plane on another host (its token then crosses "
        "the network in clear text; refused otherwise)",
    )
    add(
        "--client-cert",
        type=Path,
        metavar="FILE",
        help="a client certificate (PEM) to present to a control plane that requires one of "
        "its agents (flexai server --agent-client-ca)",
    )
    add("--client-key", type=Path, metavar="FILE", help="its PEM key (default: in --client-cert)")
    add("--accels", type=_count, metavar="N", help="accelerators to offer (default: the GPUs)")
    add("--accel-type", metavar="NAME", help='their type (default: the GPU model, else "cpu")')
    add("--name", metavar="NODE", default=socket.gethostname(), help="node name (the hostname)")
    add(
        "--address",
        metavar="HOST",
        help="how the other nodes of a multi-node job reach this one (default: the IP address "
        "of the interface that routes to the control plane)",
    )
    add(
        "--work-dir",
        type=Path,
        default=DEFAULT_WORK_DIR,
        metavar="DIR",
        help="where jobs are built and run (~/.local/share/flexai/agent)",
    )
    add(
        "--datasets-dir",
        type=Path,
        metavar="DIR",
        help="the datasets jobs may ask for, one directory each (<work-dir>/datasets)",
    )
    add(
        "--poll-interval",
        type=_seconds,
        default=0.5,
        metavar="SECONDS",
        help="how often to ask for this node's jobs (0.5)",
    )
    add(
        "--heartbeat-interval",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="how often to tell the control plane this node is alive (2)",
    )
    add(
        "--stop-grace",
        type=_grace,
        default=10.0,
        metavar="SECONDS",
        help="seconds between SIGTERM and SIGKILL when a job is stopped (10)",
    )
    add(
        "--log-drain-timeout",
        type=_grace,
        default=60.0,
        metavar="SECONDS",
        help="how long a finished job waits for its logs to be shipped before it is reported "
        "anyway; its whole log stays in job.log on this host (60)",
    )
    add(
        "--connect-timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="how long to try reaching the control plane at start (10)",
    )
    add(
        "--job-user",
        metavar="USER",
        help="the user jobs' code runs as, who cannot read the agent's files (default: nobody "
        "when the agent runs as root, else the agent's own user)",
    )
    add(
        "--job-python",
        metavar="PATH",
        help="the Python that jobs' virtual environments are made from; the job user must be "
        "able to run it, with venv and pip (default: the agent's own)",
    )
    add(
        "--job-site-packages",
        action="store_true",
        help="jobs' environments also see the packages installed for --job-python, e.g. a GPU "
        "host's preinstalled PyTorch/CUDA stack, below their own requirements",
    )
    add_sandbox_flags(parser)
    add_image_flags(parser)
    add(
        "--keep-job-dirs",
        action="store_true",
        help="keep each finished job's repo, venv and outputs (default: only its job.log)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the agent; return the process exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    if args.token is not None:
        print(
            "flexai agent: error: --token is refused: on the command line the token is readable "
            "by every process on this host (`ps`); use --token-file PATH, FLEXAI_TOKEN, or the "
            "client config",
            file=sys.stderr,
        )
        return 2
    with _stderr_logging():
        try:
            return _run(args)
        except (AgentError, CredentialError, JobUserError, WorkDirError) as error:
            print(f"flexai agent: error: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130


def _run(args: argparse.Namespace) -> int:
    environment_token = token_from_environment()  # first of all: it may restart the agent
    token = token_from_file(args.token_file) if args.token_file else environment_token
    try:
        config = load_client_config(args.server, token)
    except ConfigError as error:
        raise AgentError(f"{error} (or pass --server and --token-file)") from None
    if shutil.which("git") is None:
        raise AgentError("git is not installed on this host; install it to build jobs")
    try:  # before anything looks the server's name up
        check_url(config.api_url, True if args.allow_http else None, who="flexai agent")
    except TlsConfigError as refused:
        raise AgentError(str(refused)) from None
    certificate = _client_certificate(args)
    settings = _settings(args, config.api_url)
    work_dir, user = settings.supervisor.work_dir, settings.supervisor.job_user
    assert user is not None
    jobs = settings.supervisor.sandboxes
    own_ids = jobs is not None and jobs.active and jobs.identities is not None
    if own_ids and jobs is not None and jobs.identities is not None:  # a job's id, for the checks
        first = jobs.identities.ids.start
        user = JobUser(f"job-{first}", first, first)
    with workdir.exclusive(work_dir, jobs_run_as_another_user=not user.is_agent):
        if not user.is_agent or args.job_python:  # a sandbox shows each job its own folders
            check_can_build(user, settings.supervisor.job_python,
                            Path("/") if own_ids else work_dir / "jobs")  # fmt: skip
        if args.job_site_packages:
            _check_site_packages(settings.supervisor.job_python)
        try:
            client = ControlPlaneClient(
                config.api_url, config.token, agent_id=workdir.agent_id(work_dir),
                ca_file=str(args.ca_file) if args.ca_file else config.ca_file,
                allow_http=True if args.allow_http else None,
                client_certificate=certificate,
            )  # fmt: skip
        except TlsConfigError as refused:
            raise AgentError(str(refused)) from None
        agent = Agent(client, settings)
        with _shutdown_on_signals(agent), _closing(client):
            if not _register(agent, args):
                return 0
            if jobs is not None:
                said = log.info if jobs.active and jobs.identities else log.warning
                said("isolation: %s: %s", jobs.isolation.level, jobs.isolation.detail)
            if warning := shared_user_warning(user):
                log.warning("%s", warning)
            elif not own_ids:
                python = settings.supervisor.job_python
                log.info(
                    "jobs run as %s; their virtual environments are made from %s", user.name, python
                )
            agent.run()
    if agent.displaced_by is not None:
        raise AgentError(
            f"another agent took over node {args.name} while this one was silent; this agent "
            "ended its jobs' processes: give it another --name, or stop the other agent"
        )
    log.info("agent stopped")
    return 0


def _client_certificate(args: argparse.Namespace) -> tuple[str, str | None] | None:
    if args.client_cert is None:
        if args.client_key is not None:
            raise AgentError("--client-key needs --client-cert: give the certificate too")
        return None
    return str(args.client_cert), str(args.client_key) if args.client_key else None


def _check_site_packages(python: str) -> None:
    """Fail at start when ``--job-site-packages`` has no packages of ``python`` to offer."""
    try:
        folders = host_site_packages(python)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        raise AgentError(
            f"--job-site-packages: cannot ask {python} for its site-packages ({error}); "
            "check --job-python"
        ) from None
    if not folders:
        raise AgentError(f"--job-site-packages: {python} has no site-packages directory")
    log.info("jobs' environments also see the packages in %s", ", ".join(folders))


def _register(agent: Agent, args: argparse.Namespace) -> bool:
    """Register the node; False when the agent was asked to stop meanwhile."""
    try:
        agent.register(retry_for=args.connect_timeout)
    except ApiUnavailable as error:
        if agent.shutting_down:
            return False
        raise AgentError(
            f"{error}; tried for {args.connect_timeout:g} s. Is the server running "
            "there? Check --server"
        ) from None
    except NodeTaken:
        raise AgentError(
            f"another agent holds node {args.name}: give this agent another --name, "
            "or stop the other agent first"
        ) from None
    except ApiError as error:
        if error.status in (401, 403):
            raise AgentError(
                f"the control plane refused the token ({error}); check --token-file, "
                "FLEXAI_TOKEN or the client config"
            ) from None
        raise AgentError(f"registration refused: {error}") from None
    return True


def _settings(args: argparse.Namespace, api_url: str) -> AgentSettings:
    gpus = detect_gpus()
    accels = args.accels if args.accels is not None else len(gpus)
    if not accels:
        raise AgentError("no GPU found on this host; pass --accels N (the job slots to offer)")
    if accels > len(gpus) > 0:
        log.warning(
            "this host has %d GPUs; --accels %d offers stand-in accelerators instead",
            len(gpus),
            accels,
        )
    offered = tuple(gpus[:accels]) if accels <= len(gpus) else ()
    work_dir = args.work_dir.expanduser().resolve()
    datasets_dir = args.datasets_dir or work_dir / "datasets"
    shared = job_user(args.job_user)
    try:
        jobs = sandboxes(args, work_dir, shared, accels, device_nodes(offered))
    except argparse.ArgumentTypeError as error:
        raise AgentError(str(error)) from None
    return AgentSettings(
        name=args.name,
        accels=accels,
        accel_type=args.accel_type or (offered[0].model if offered else "cpu"),
        gpus=offered,
        address=args.address or default_address(api_url),
        poll_interval=args.poll_interval,
        heartbeat_interval=args.heartbeat_interval,
        supervisor=SupervisorSettings(
            work_dir=work_dir,
            datasets_dir=datasets_dir.expanduser().resolve(),
            stop_grace=args.stop_grace,
            log_drain_timeout=args.log_drain_timeout,
            keep_job_dirs=args.keep_job_dirs,
            job_user=shared,
            job_python=args.job_python or sys.executable,
            job_site_packages=args.job_site_packages,
            sandboxes=jobs,
            images=image_settings(args),
        ),
    )


@contextmanager
def _shutdown_on_signals(agent: Agent) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, _frame: object) -> None:
        log.info("%s received, shutting down", signal.Signals(signum).name)
        agent.request_shutdown()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def _stderr_logging() -> Iterator[None]:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s flexai agent: %(message)s", "%Y-%m-%d %H:%M:%S")
    )
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)


@contextmanager
def _closing(client: ControlPlaneClient) -> Iterator[None]:
    try:
        yield
    finally:
        client.close()


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text!r}")
    return value


def _grace(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds, 0 or more, got {text!r}")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
