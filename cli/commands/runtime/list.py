"""Lists the Runtimes: the images an admin named for jobs to run in (`flexai training run
--runtime NAME`), each with the digest and the nodes holding it once the agents report them.
"""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag, print_listing


def configure(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.tables import render_runtimes_table

    with ApiClient.from_config() as client:
        answer = client.list_runtimes()
    return print_listing(args, answer, "runtimes", render_runtimes_table,
                         "No runtimes: jobs run on the nodes' own system. An admin makes one "
                         "with `flexai admin runtime create NAME --image REF`.")  # fmt: skip
