"""The Runtimes jobs may run in: `create NAME --image REF` names an image (REF:
docker://HOST[:PORT]/PATH[:TAG|@sha256:DIGEST]; a bare HOST/PATH is taken as docker://), with
`--registry-secret SECRET` one of your secrets holding USER:PASSWORD for a private registry
(the runtime keeps its name, never its value); `delete NAME`. Jobs submitted before keep the
image they were given. Everyone lists them with `flexai runtime list`. Needs an admin's token.

Examples:
  flexai admin runtime create nvidia-25.06 --image docker://nvcr.io/nvidia/pytorch:25.06-py3
  flexai secret create ngc-login   # its value: $oauthtoken:<your NGC API key>
  flexai admin runtime create ngc-25.06 --image nvcr.io/nvidia/pytorch:25.06-py3 \\
      --registry-secret ngc-login
"""

from __future__ import annotations

import argparse

from cli.commands import contract_type
from common.contract import RUNTIME_RULE, check_image_ref, check_runtime_name

_name = contract_type("runtime name", check_runtime_name)
_image = contract_type("image", check_image_ref)


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="name an image for jobs to run in")
    create.add_argument("name", metavar="NAME", type=_name,
                        help=f"the runtime's name: {RUNTIME_RULE}")  # fmt: skip
    create.add_argument("--image", required=True, type=_image, metavar="REF",
                        help="docker://HOST[:PORT]/PATH[:TAG|@sha256:DIGEST]")  # fmt: skip
    create.add_argument("--registry-secret", metavar="SECRET",
                        help="your secret holding USER:PASSWORD for the image's registry")
    delete = actions.add_parser("delete", help="delete a runtime (jobs keep their image)")
    delete.add_argument("name", metavar="NAME", type=_name, help="the runtime's name")


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient

    with ApiClient.from_config() as client:
        if args.action == "create":
            made = client.create_runtime(args.name, args.image, args.registry_secret)
            print(f"Created runtime {made.get('name', args.name)}: {made.get('image')}.")
            print(f"Jobs run in it with `flexai training run NAME ... --runtime {args.name}`.")
        else:
            client.delete_runtime(args.name)
            print(f"Deleted runtime {args.name}.")
    return 0
