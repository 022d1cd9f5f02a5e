"""Checks the ledger: its hash chain, and the views against it.

The server recomputes every stored event's hash, chained per job and into a running digest of
the whole ledger, and names the first event whose stored row was altered, deleted, inserted or
reordered; then it folds every job from the ledger and compares it with what `list` and
`inspect` show. Exits 1 when it finds anything, 0 when all agrees.

Keep the head digest it prints somewhere else: `--expect-digest` then also catches a ledger
whose chain was rewritten to match an edit. Needs the admin token.
"""

from __future__ import annotations

import argparse
import re

from cli.commands import add_json_flag

DIGEST = re.compile(r"[0-9a-f]{64}")


def digest(value: str) -> str:
    if not DIGEST.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r:.80} is not a head digest: give the 64 hex digits `verify` printed"
        )
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--expect-digest", type=digest, metavar="DIGEST",
        help="the head digest an earlier verify printed: fail unless the ledger still ends in it",
    )  # fmt: skip
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json

    with ApiClient.from_config() as client:
        answer = client.admin_verify(args.expect_digest)
    if args.json:
        print(render_json(answer))
        return 0 if answer.get("ok") else 1
    chained = answer.get("chained", 0)
    print(f"ledger: {answer.get('events', 0)} events, {chained} in the hash chain")
    if answer.get("unchained_before"):
        print(f"  events before position {answer['unchained_before']} were written before the "
              "ledger kept its chain: not checked")  # fmt: skip
    if answer.get("head_digest"):
        print(f"  head digest: {answer['head_digest']}")
    for problem in answer.get("ledger_problems") or []:
        print(f"  LEDGER: {problem}")
    print(f"views: {answer.get('jobs', 0)} jobs folded from the ledger and compared")
    for difference in answer.get("view_differences") or []:
        print(f"  VIEWS: {difference}")
    if answer.get("ok"):
        print("ok: the ledger's chain holds and the views agree with it")
        return 0
    print("verify found problems (above)")
    return 1
