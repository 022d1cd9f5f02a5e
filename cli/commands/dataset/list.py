"""Lists your Datasets.

By name, each with its latest version (the one jobs submitted from now on get): its size, its
number of files, the start of its content hash and when it was pushed.
"""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag, print_listing


def configure(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.datasets import render_datasets_table

    with ApiClient.from_config() as client:
        answer = client.list_datasets()
    return print_listing(args, answer, "datasets", render_datasets_table,
                         "No datasets. Push one with `flexai dataset push NAME PATH`.")
