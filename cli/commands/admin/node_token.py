"""Makes a token for one node's agent: `create NODE_NAME` prints it.

A node token reaches only the agent routes, and only for that node and the jobs placed on
it; users' tokens are refused there. Start the agent with it: `flexai admin node-token create
gpu-1 -o gpu-1.token` (a file readable by you alone), then `flexai agent --name gpu-1
--token-file gpu-1.token` (or FLEXAI_TOKEN). Without -o it is printed once, alone on standard
output. `flexai admin token list --all-users` lists node tokens, `flexai admin token revoke`
revokes one. Needs an admin's token.
"""

from __future__ import annotations

import argparse
import sys

from cli.commands import add_json_flag


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="make a node's token and print it")
    create.add_argument("node", metavar="NODE_NAME", help="the agent's --name")
    create.add_argument("--label", default="", metavar="TEXT", help="what it is for")
    create.add_argument("-o", "--output", metavar="FILE",
                        help="write it to FILE (a new file, mode 0600), not to standard output")
    add_json_flag(create)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json

    with ApiClient.from_config() as client:
        answer = client.create_node_token(args.node, label=args.label)
    if args.json:
        print(render_json(answer))
        return 0
    where = "FILE"
    if args.output:
        write_private(args.output, answer["token"])
        where = args.output
    else:
        print(answer["token"])
    print(f"made a token for node {answer['node']} (id {answer['token_id']}), shown this once: "
          f"start its agent with `flexai agent --name {answer['node']} --token-file {where}`",
          file=sys.stderr)  # fmt: skip
    return 0


def write_private(path: str, token: str) -> None:
    """A new file readable by its owner alone, from its first byte."""
    import os

    from cli.errors import CliError

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CliError(f"{path} exists: give -o a new file's path (or delete it)") from None
    except OSError as error:
        raise CliError(f"cannot write {path}: {error.strerror}") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
