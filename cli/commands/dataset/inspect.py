"""Displays a Dataset and its versions.

Its latest version (content hash, size, files, when and by whom it was pushed), then every
version, newest first. A job keeps the version it was submitted with: `flexai training
inspect JOB` shows its hash.
"""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag
from cli.commands.dataset import add_dataset_name


def configure(parser: argparse.ArgumentParser) -> None:
    add_dataset_name(parser)
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.datasets import render_dataset
    from cli.output.formats import render_json

    with ApiClient.from_config() as client:
        dataset = client.get_dataset(args.name)
    print(render_json(dataset) if args.json else render_dataset(dataset))
    return 0
