"""Creates a Secret: a value kept encrypted by the control plane.

The value is read from stdin (one trailing newline dropped: `printf %s "$TOKEN" | flexai secret
create hf-token`, or `< file`), or asked for without echo on a terminal. It is never shown
again: jobs get it in an environment variable with `flexai training run --secret
ENV_VAR=NAME`, and their logs show `***` where they print it. A name you already use is
refused; `--update` replaces its value (jobs that build from then on get the new one).
"""

from __future__ import annotations

import argparse
import sys

from cli.commands.secret import add_secret_name
from cli.errors import CliError

MAX_VALUE_BYTES = 64 * 1024
MIN_SECRET_VALUE = 4
"""Characters: jobs' logs show *** for a value, and a shorter one would hide too much."""


def configure(parser: argparse.ArgumentParser) -> None:
    add_secret_name(parser)
    parser.add_argument(
        "--update", action="store_true",
        help="replace the value of the secret if it exists (else create it)",
    )  # fmt: skip


def read_value(name: str) -> str:
    """The value: typed without echo on a terminal (twice), else all of stdin."""
    if sys.stdin.isatty():
        import getpass

        value = getpass.getpass(f"Value of secret {name}: ")
        if getpass.getpass("Again, to confirm: ") != value:
            raise CliError("the two values differ; nothing was stored: run the command again")
    else:
        try:
            value = sys.stdin.buffer.read().decode()
        except UnicodeDecodeError:
            raise CliError("the value must be UTF-8 text; nothing was stored") from None
        value = value[:-2] if value.endswith("\r\n") else value.removesuffix("\n")
    if not value:
        raise CliError(
            f"the value of secret {name} is empty; give it on stdin "
            f"(`printf %s VALUE | flexai secret create {name}`) or type it when asked"
        )
    if "\x00" in value:
        raise CliError("the value holds a NUL byte, which an environment variable cannot hold")
    if len(value.encode(errors="surrogatepass")) > MAX_VALUE_BYTES:
        raise CliError(f"the value is larger than {MAX_VALUE_BYTES} bytes; nothing was stored")
    if len(value) < MIN_SECRET_VALUE:
        raise CliError(
            f"the value of secret {name} is {len(value)} characters; a secret needs at least "
            f"{MIN_SECRET_VALUE}: jobs' logs show *** wherever it appears, so a shorter one "
            "would hide those characters everywhere in them. Nothing was stored"
        )
    return value


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient

    value = read_value(args.name)
    with ApiClient.from_config() as client:
        stored = client.create_secret(args.name, value, update=args.update)
    done = "Created" if stored.get("created_at") == stored.get("updated_at") else "Updated"
    print(f"{done} secret {stored.get('name', args.name)}. Give it to a job with "
          f"`flexai training run ... --secret ENV_VAR={args.name}`.")  # fmt: skip
    return 0
