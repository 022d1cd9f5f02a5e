"""Lists your Datasets.

By name, each with its latest version (the one jobs submitted from now on get): its size, its
number of files, the start of its content hash and when it was pushed.
"""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag


def configure(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.datasets import render_datasets_table
    from cli.output.formats import render_json

    with ApiClient.from_config() as client:
        answer = client.list_datasets()
    if args.json:
        print(render_json(answer))
        return 0
    datasets = answer.get("datasets") or []
    if not datasets:
        print("No datasets. Push one with `flexai dataset push NAME PATH`.")
        return 0
    print(render_datasets_table(datasets))
    return 0
