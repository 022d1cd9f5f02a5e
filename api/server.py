"""`flexai server`: the API, projection worker and scheduler in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api.settings import Limits
from api.tls import Certificate, ServerTls, TlsError
from common.contract import DEFAULT_REPOSITORY_KINDS, REPOSITORY_KINDS

log = logging.getLogger("api.server")

DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "flexai" / "server"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="flexai server",
        description="Run the control plane: REST API, projections and scheduler.",
    )
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="SQLite file, artifacts and the admin token (default: %(default)s)")
    parser.add_argument("--database-url", default=None,
                        help="postgresql://USER@HOST:PORT/DB; default: SQLite in the data dir")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default: %(default)s; 0.0.0.0: all)")
    parser.add_argument("--port", type=int, default=8000)
    tls = parser.add_argument_group(
        "TLS (serve https://, or stay on 127.0.0.1 behind a TLS proxy)")
    tls.add_argument("--tls-cert", type=Path, default=None, metavar="FILE",
                     help="serve HTTPS with this PEM certificate (chain); reloaded with the "
                          "key on SIGHUP (kill -HUP PID) without dropping a connection")
    tls.add_argument("--tls-key", type=Path, default=None, metavar="FILE",
                     help="its unencrypted PEM private key (default: in --tls-cert's file)")
    tls.add_argument("--agent-client-ca", type=Path, default=None, metavar="FILE",
                     help="require agents to present a client certificate signed by this CA "
                          "(PEM) on the agent routes, besides their node token (flexai agent "
                          "--client-cert FILE --client-key FILE); needs --tls-cert")
    tls.add_argument("--forwarded-allow-ips", default=None, metavar="IP,...",
                     help="the proxies whose X-Forwarded-Proto/-For headers are believed, so "
                          "that what the server hands out keeps the client's https:// ('*': "
                          "any; default: $FORWARDED_ALLOW_IPS, else 127.0.0.1,::1)")
    parser.add_argument("--scheduling-patience", type=float, default=30.0, metavar="SECONDS",
                        help="how long a job waits for a live node before it is rejected")
    parser.add_argument("--node-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="a node silent this long is offline")
    parser.add_argument("--preempt-after", type=_preempt_after, default=120.0, metavar="SECONDS",
                        help="how long a job waits in a node's line before it preempts "
                             "running --preemptible jobs of lower priority there; 'never' "
                             "turns preemption off (default: %(default)s)")
    parser.add_argument("--require-isolation", action="store_true",
                        help="place jobs only on nodes whose agent runs each job in a sandbox "
                             "of its own (`flexai admin node list`: ISOLATION sandbox)")
    parser.add_argument("--no-client-config", action="store_true",
                        help="do not write the client config file")
    parser.add_argument("--database-wait", type=float, default=1.5, metavar="SECONDS",
                        help="how long a request waits for a PostgreSQL connection before it "
                             "is answered 503 database-unavailable (default: %(default)s)")
    parser.add_argument("--default-time-limit", type=_duration, default=None,
                        metavar="DURATION",
                        help="the time limit of jobs submitted without --time-limit, e.g. 12h "
                             "(default: none)")
    parser.add_argument("--stop-confirm-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="after a job's stop grace, how long a node has to confirm a stop "
                             "before the job is 'stop failed' (default: %(default)s)")
    parser.add_argument("--skip-event", type=int, action="append", default=[],
                        metavar="POSITION",
                        help="let the views pass over the event at this ledger position (one "
                             "/health names as the reason they halted); repeatable")
    parser.add_argument("--allowed-repo-schemes", type=_kinds, metavar="KIND,...",
                        default=",".join(DEFAULT_REPOSITORY_KINDS),
                        help="the repository URLs jobs may name, among "
                             f"{', '.join(f'{k} ({v})' for k, v in REPOSITORY_KINDS.items())};"
                             " git options (-...) and transport helpers (ext::...) never "
                             "pass (default: %(default)s)")
    artifacts = parser.add_argument_group(
        "artifacts (logs, checkpoints, outputs, datasets; default: files under --data-dir)")
    artifacts.add_argument("--artifact-store", default=None, metavar="s3://BUCKET[/PREFIX]",
                           help="keep artifacts in this S3 bucket; credentials come from the "
                                "AWS environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                                "a shared config profile, an instance role)")
    artifacts.add_argument("--s3-endpoint-url", default=None, metavar="URL",
                           help="an S3-compatible store's endpoint (default: AWS S3)")
    artifacts.add_argument("--s3-region", default=None, metavar="REGION",
                           help="the bucket's region (default: the AWS environment's)")
    ledger = parser.add_argument_group("stored events (the first server to write them decides)")
    ledger.add_argument("--ledger-key-file", type=Path, default=None, metavar="PATH",
                        help="encrypt stored events with the base64 AES key in this file (mode "
                             "600; `head -c 32 /dev/urandom | base64 > PATH`); default: "
                             "$FLEXAI_LEDGER_KEY_FILE, else not encrypted")
    ledger.add_argument("--compress-events", action="store_true",
                        help="compress stored events with zlib")
    limits = parser.add_argument_group("limits (each refusal is a 413, 422 or 503 problem)")
    for name, field in Limits.model_fields.items():
        limits.add_argument(f"--max-{name.replace('_', '-')}", dest=f"max_{name}", type=int,
                            default=field.default, metavar="N",
                            help=f"{field.description} (default: %(default)s)")
    return parser.parse_args(argv)  # fmt: skip


def _kinds(text: str) -> frozenset[str]:
    kinds = frozenset(part.strip().lower() for part in text.split(",") if part.strip())
    unknown = sorted(kinds - set(REPOSITORY_KINDS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown kind {unknown[0]!r}: use some of {', '.join(REPOSITORY_KINDS)}"
        )
    return kinds


def _duration(text: str) -> int:
    from common.durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _quiet_exit_server(config: Any, tls: ServerTls | None = None) -> Any:
    """A uvicorn server that ends on SIGTERM/SIGINT with exit code 0, not by re-raising them,
    and loads ``tls`` again on SIGHUP."""
    import uvicorn

    class Server(uvicorn.Server):
        loop: asyncio.AbstractEventLoop | None = None
        """Where the requests run (known once the server starts)."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().startup(sockets)

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handlers = {signal.SIGINT: self.handle_exit, signal.SIGTERM: self.handle_exit,
                        signal.SIGHUP: self.handle_hangup}  # fmt: skip
            original = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

        def handle_hangup(self, sig: int, frame: Any) -> None:
            """SIGHUP: load the certificate and key again (on the loop, between requests)."""
            if self.loop is not None and not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self.reload_tls)

        def reload_tls(self) -> None:
            from api.tls import TlsError

            if tls is None or self.config.ssl is None:
                log.info("SIGHUP: no TLS certificate to reload (this server serves plain HTTP)")
                return
            try:
                log.info("SIGHUP: serving the TLS certificate %s", tls.reload(self.config.ssl))
            except TlsError as error:
                log.error("SIGHUP: %s; still serving the certificate loaded before", error)

    return Server(config)


def _ending_long_requests(server: Any, services: Any) -> None:
    """On SIGTERM, end at once every `logs --follow` stream, agents' long polls (assignments
    and debug-session offers) and debug session, so that the graceful shutdown finds no
    request to wait for (followers and agents resume at their offset once a server answers).

    The handler only asks the event loop to end them: it may interrupt the loop's own thread
    inside a lock that ending them takes."""
    from api.http.app import end_long_requests

    handle_exit = server.handle_exit

    def handle_exit_and_end_streams(sig: int, frame: Any) -> None:
        loop = server.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(end_long_requests, services)
        handle_exit(sig, frame)

    server.handle_exit = handle_exit_and_end_streams


def _settings(args: argparse.Namespace) -> Any:
    from pydantic import SecretStr

    from api.ledger.format import key_file_from_env, read_key_file
    from api.settings import Settings

    key_file = args.ledger_key_file or key_file_from_env()
    return Settings(
        ledger_key=SecretStr(read_key_file(key_file)) if key_file else None,
        compress_events=args.compress_events,
        data_dir=args.data_dir, database_url=args.database_url, host=args.host, port=args.port,
        scheduling_patience_s=args.scheduling_patience, node_timeout_s=args.node_timeout,
        preempt_after_s=args.preempt_after, require_isolation=args.require_isolation,
        agent_client_certificates=args.agent_client_ca is not None,
        write_client_config=not args.no_client_config, skip_events=frozenset(args.skip_event),
        database_wait_s=args.database_wait, default_time_limit_s=args.default_time_limit,
        stop_confirm_timeout_s=args.stop_confirm_timeout,
        allowed_repo_schemes=args.allowed_repo_schemes, artifact_store=args.artifact_store,
        s3_endpoint_url=args.s3_endpoint_url, s3_region=args.s3_region,
        limits=Limits(**{name: getattr(args, f"max_{name}") for name in Limits.model_fields}),
    )  # fmt: skip


_FLAGS = {"database_wait_s": "--database-wait", "node_timeout_s": "--node-timeout",
          "stop_confirm_timeout_s": "--stop-confirm-timeout",
          "default_time_limit_s": "--default-time-limit",
          "scheduling_patience_s": "--scheduling-patience",
          "preempt_after_s": "--preempt-after"}  # fmt: skip


def _preempt_after(text: str) -> float | None:
    if text.strip().lower() == "never":
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds; give e.g. 120, or 'never'") from None
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 seconds or more, or 'never'")
    return seconds


def _first_error(error: ValueError) -> str:
    """The first complaint of a pydantic ValidationError, named by its flag."""
    errors = getattr(error, "errors", None)
    if not callable(errors):
        return str(error)
    first = errors()[0]
    field = str(first["loc"][-1]) if first["loc"] else ""
    flag = _FLAGS.get(field) or (
        f"--max-{field.replace('_', '-')}" if field in Limits.model_fields
        else f"--{field.replace('_', '-')}"
    )  # fmt: skip
    return f"{flag}: {first['msg']}"


def _tls(args: argparse.Namespace) -> tuple[ServerTls | None, Certificate | None]:
    """The server's certificate, checked (TlsError: what is wrong with the files)."""
    if args.tls_cert is None:
        for flag in ("--tls-key", "--agent-client-ca"):
            if getattr(args, flag[2:].replace("-", "_")) is not None:
                raise TlsError(f"{flag} needs --tls-cert: give the server's certificate too")
        return None, None
    tls = ServerTls(args.tls_cert, args.tls_key, args.agent_client_ca)
    certificate = tls.check()
    if warning := tls.loose_key_warning():
        print(f"warning: {warning}", file=sys.stderr)
    return tls, certificate


def _client_certificates(tls: ServerTls | None) -> dict[str, Any]:
    """uvicorn's settings for asking clients for a certificate and passing it to the app."""
    if tls is None or tls.client_ca is None:
        return {}
    import ssl

    from api.http.client_certificates import protocols

    http, ws = protocols()
    return {"ssl_ca_certs": str(tls.client_ca), "ssl_cert_reqs": ssl.CERT_OPTIONAL,
            "http": http, "ws": ws or "none"}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("botocore").setLevel(logging.WARNING)  # "found credentials in ...", each
    import uvicorn

    from api.artifacts.store import StorageUnavailable
    from api.http.app import create_app
    from api.identity.identities import ensure_admin_token
    from api.identity.secrets import SecretKeyError
    from api.ledger.format import LedgerFormatMismatch, LedgerKeyError
    from api.services import build_services
    from api.tls import plain_http_warning, public_host
    from common.client_config import ClientConfig, ConfigError, config_path, write_client_config

    try:
        settings = _settings(args)
    except LedgerKeyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ValueError as error:  # pydantic's ValidationError: a flag out of its bounds
        print(f"error: {_first_error(error)}", file=sys.stderr)
        return 2
    try:
        tls, certificate = _tls(args)
    except TlsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        services = build_services(settings)
    except (LedgerFormatMismatch, SecretKeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except StorageUnavailable as error:  # the bucket does not answer, or refuses
        print(f"error: {error}; check --artifact-store, --s3-endpoint-url, --s3-region and the "
              "AWS credentials", file=sys.stderr)  # fmt: skip
        return 1
    except Exception as error:  # an unreachable database, a bad URL: say it in one line
        reason = " ".join(str(error).split())
        print(f"error: cannot open storage ({settings.resolved_database_url}): {reason}; "
              "check --database-url and that the database server runs",
              file=sys.stderr)  # fmt: skip
        return 1
    token, created = ensure_admin_token(services.identities, settings.data_dir)
    if created:
        print(f"created the admin API token: {token}", flush=True)
    host = public_host(settings.host, certificate)
    url = f"{'https' if tls else 'http'}://{host}:{settings.port}"
    if settings.write_client_config:
        trusted = str(tls.cert_file.resolve()) if tls else None
        try:
            path = write_client_config(ClientConfig(url, token, trusted), config_path())
            print(f"wrote the client config to {path}", flush=True)
        except (OSError, ConfigError) as error:
            print(f"warning: could not write the client config: {error}", file=sys.stderr)
    print(f"flexai server listening on {url} (storage: "
          f"{'PostgreSQL' if args.database_url else 'SQLite in ' + str(settings.data_dir)}; "
          f"artifacts: {services.artifacts.where})", flush=True)  # fmt: skip
    if certificate is not None:
        print(f"TLS certificate {certificate}; SIGHUP reloads it", flush=True)
        if args.agent_client_ca is not None:
            print(f"agents must present a client certificate signed by {args.agent_client_ca}",
                  flush=True)  # fmt: skip
    elif warning := plain_http_warning(settings.host, args.forwarded_allow_ips is not None):
        print(warning, file=sys.stderr, flush=True)
    config = uvicorn.Config(
        create_app(services), host=settings.host, port=settings.port, log_level="warning",
        timeout_graceful_shutdown=3, forwarded_allow_ips=args.forwarded_allow_ips,
        ssl_certfile=tls.cert_file if tls else None, ssl_keyfile=tls.key_file if tls else None,
        **_client_certificates(tls),
    )  # fmt: skip
    server = _quiet_exit_server(config, tls)
    _ending_long_requests(server, services)
    # What start-up made (94,000 objects) lives as long as the server: no collection looks at
    # it again. A full collection held every thread for 16 ms before, under 1 ms after.
    gc.freeze()
    try:
        server.run()
    finally:
        services.close()
    print("flexai server stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
