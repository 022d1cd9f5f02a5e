"""Pushes a file or a directory as a Dataset.

The control plane keeps it as a zip archive, known by its content hash (SHA-256). Pushing a
name again makes a new version: jobs submitted from then on get it, jobs submitted before
keep theirs. Pushing unchanged content again changes nothing. A job gets the dataset with
`flexai training run ... -D NAME`, read-only at `$FLEXAI_INPUT_DIR/NAME`: a directory's
contents, or a single file under its own name. Links to directories are left out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.commands.dataset import add_dataset_name


def configure(parser: argparse.ArgumentParser) -> None:
    add_dataset_name(parser)
    parser.add_argument("path", metavar="PATH", type=Path, help="a file or a directory")


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.commands.dataset.archive import ZipStream, scan
    from cli.errors import CliError
    from cli.output.datasets import render_pushed_dataset

    scanned = scan(args.path)
    if scanned.left_out:
        print(f"Left out (not a file nor a directory): {', '.join(scanned.left_out[:10])}")
    archive = ZipStream(scanned)
    with ApiClient.from_config() as client:
        dataset = client.push_dataset(args.name, archive)
    if dataset.get("content_hash") != archive.sha256:
        raise CliError(
            f"the control plane stored the archive with hash {dataset.get('content_hash')}, "
            f"not {archive.sha256} as it was sent; push it again"
        )
    print(render_pushed_dataset(dataset, archive.size))
    return 0
