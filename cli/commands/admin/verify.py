"""Checks the ledger: its hash chain, the views against it, and the artifacts it names.

The server recomputes every stored event's hash, chained per job and into a running digest of
the whole ledger, and names the first event whose stored row was altered, deleted, inserted or
reordered; then it folds every job from the ledger and compares it with what `list` and
`inspect` show; then it looks for every checkpoint, output and dataset version the ledger
records in the artifact store, with the size recorded (`--artifacts deep`: and the SHA-256,
each object read whole; `none`: not at all), and names each one missing or altered (its job,
kind and key). The artifacts of purged jobs are gone on purpose and not looked for. Exits 1
when it finds anything, 0 when all agrees.

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
    parser.add_argument(
        "--artifacts", choices=("none", "shallow", "deep"), default="shallow",
        help="look for each artifact the ledger names: with its size (shallow, the default), "
             "its SHA-256 too (deep), or not (none)",
    )  # fmt: skip
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json

    with ApiClient.from_config() as client:
        answer = client.admin_verify(args.expect_digest, args.artifacts)
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
    if answer.get("artifacts", "none") != "none":
        how = "size and SHA-256" if answer["artifacts"] == "deep" else "size"
        print(f"artifacts: {answer.get('artifacts_checked', 0)} the ledger names, each looked "
              f"for in the store with its {how}")  # fmt: skip
    for problem in answer.get("artifact_problems") or []:
        whose = (f"job {problem['job']} ({problem['name']})" if problem.get("job")
                 else f"dataset {problem['name']}")  # fmt: skip
        print(f"  ARTIFACT: {whose} {problem['kind']} {problem['key']}: {problem['problem']}")
    if answer.get("ok"):
        print("ok: the ledger's chain holds, the views agree with it, and the store holds "
              "what it records" if answer.get("artifacts", "none") != "none" else
              "ok: the ledger's chain holds and the views agree with it")  # fmt: skip
        return 0
    print("verify found problems (above)")
    return 1
