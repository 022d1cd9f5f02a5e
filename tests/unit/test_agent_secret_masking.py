"""Secret values masked out of shipped logs: wherever the chunks are cut, however often a
value repeats, and when values are substrings of one another; and the fetch of a job's
values, whose failures say which secret is missing and never what any value is."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from node_agent.build.secrets import fetch_secrets
from node_agent.client import ApiError, ApiUnavailable, ControlPlaneClient
from node_agent.logs.masking import SecretMask, mask_all
from node_agent.logs.shipper import LogShipper
from node_agent.models import Assignment, JobSpec
from tests.fake_http import serve_json, server_url
from tests.unit.test_agent_logship import LogStore, serve

TOKEN = "hf_3xAmpLeT0kEn"


def fed_in_pieces(data: bytes, values: list[str], cuts: list[int]) -> bytes:
    mask, out, start = SecretMask(values), bytearray(), 0
    for cut in [*cuts, len(data)]:
        out += mask.feed(data[start:cut])
        start = cut
    return bytes(out + mask.feed(b"", final=True))


def test_a_value_is_replaced_by_stars_every_time_it_appears() -> None:
    line = f"token={TOKEN} again {TOKEN}{TOKEN}\n".encode()
    assert mask_all(line, [TOKEN]) == b"token=*** again ******\n"


def test_a_value_split_across_two_chunks_is_masked_at_every_cut() -> None:
    data = f"before {TOKEN} after\n".encode()
    for cut in range(len(data) + 1):
        assert fed_in_pieces(data, [TOKEN], [cut]) == b"before *** after\n", cut


def test_a_value_cut_into_single_bytes_is_masked() -> None:
    data = f"x{TOKEN}y".encode()
    assert fed_in_pieces(data, [TOKEN], list(range(1, len(data)))) == b"x***y"


def test_the_longest_value_wins_where_values_are_substrings_of_each_other() -> None:
    values = ["abc", "abcdef", "cde"]
    assert mask_all(b"1 abcdef 2 abc 3 abcde 4 cde", values) == b"1 *** 2 *** 3 ***de 4 ***"
    for cut in range(len(b"abcdef") + 1):
        assert fed_in_pieces(b"abcdef", values, [cut]) == b"***", cut


def test_masking_does_not_depend_on_where_chunks_are_cut() -> None:
    rng = random.Random(7)
    values = ["s3cr3t", "s3c", "3t!", "zz", "token-" * 5]
    alphabet = "s3cr3t!z token-\n"
    for _ in range(300):
        data = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 120))).encode()
        cuts = sorted(rng.sample(range(len(data) + 1), rng.randrange(0, min(8, len(data) + 1))))
        whole = mask_all(data, values)
        assert fed_in_pieces(data, values, cuts) == whole
        assert not any(value.encode() in whole for value in values if len(value) > 3)


def test_a_quiet_stream_gives_back_everything_that_cannot_begin_a_value() -> None:
    mask = SecretMask([TOKEN])
    line = b"marker mk-1234567890abcdef\n"
    assert mask.feed(line) == line and mask.held == 0
    assert mask.feed(b"loss 0.1 " + TOKEN[:5].encode()) == b"loss 0.1 "
    assert mask.held == 5  # they begin the value: they wait for what comes next
    assert mask.feed(b"!\n") == TOKEN[:5].encode() + b"!\n"


def test_only_the_longest_open_prefix_is_held_even_for_a_long_value() -> None:
    value = "kkkk-" + "x" * 1995  # a 2,000-byte secret, as a service account's JSON
    mask = SecretMask([value])
    assert mask.feed(b"step 1\n") == b"step 1\n"  # not 1,999 bytes held: none could begin it
    assert mask.feed(b"kkk") == b"" and mask.held == 3
    assert mask.feed(b"k-") == b"" and mask.held == 5
    assert mask.feed(b"kk") == b"kkkk-" and mask.held == 2  # "kk" could begin it again
    assert mask.feed(b"\n") == b"kk\n" and mask.held == 0


def test_a_whole_value_that_could_still_grow_into_a_longer_one_waits() -> None:
    mask = SecretMask(["abc", "abcdef"])
    assert mask.feed(b"x abc") == b"x " and mask.held == 3
    assert mask.feed(b"de") == b"" and mask.held == 5
    assert mask.feed(b"!") == b"***de!"


def test_a_value_that_ends_where_another_could_begin_is_masked_at_once() -> None:
    mask = SecretMask(["xyz", "zq"])
    assert mask.feed(b"xyz") == b"***" and mask.held == 0
    assert mask.feed(b"zq") == b"***"


# -- the shipper ------------------------------------------------------------------------------


@pytest.fixture
def store() -> LogStore:
    return LogStore()


@pytest.fixture
def client(store: LogStore) -> Iterator[ControlPlaneClient]:
    server = serve(store)
    client = ControlPlaneClient(server_url(server), "t0ken")
    yield client
    client.close()
    server.shutdown()


def test_shipped_logs_show_stars_where_the_job_printed_a_value(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    shipper = LogShipper(client, "job-1", tmp_path / "job.log", flush_interval=0.01,
                         secret_values=[TOKEN, "pw"])  # fmt: skip
    text = f"using {TOKEN}\n" * 50 + "password pw\n"
    for piece in (text[i : i + 7] for i in range(0, len(text), 7)):  # values split
        shipper.write(piece.encode())
    assert shipper.close(timeout=30)
    assert bytes(store.data) == b"using ***\n" * 50 + b"password ***\n"
    assert (tmp_path / "job.log").read_text() == text  # the node keeps the log as it was
    assert shipper.acknowledged == shipper.written


def test_small_batches_and_a_resync_send_the_same_masked_log(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    store.chunk_limit = 1024
    shipper = LogShipper(client, "job-1", tmp_path / "job.log", flush_interval=0.01,
                         max_batch=4096, secret_values=[TOKEN])  # fmt: skip
    lines = [f"line {i} {TOKEN if i % 3 == 0 else 'plain'}\n" for i in range(2000)]
    shipper.write("".join(lines).encode())
    assert shipper.close(timeout=30)
    assert bytes(store.data) == mask_all("".join(lines).encode(), [TOKEN])
    assert max(store.chunks) <= 1024
    assert TOKEN.encode() not in store.data


def test_a_restarted_shipper_resends_the_masked_log_without_duplicating_it(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    first = LogShipper(client, "job-1", tmp_path / "job.log", flush_interval=0.01,
                       secret_values=[TOKEN])  # fmt: skip
    first.write(f"one {TOKEN}\n".encode())
    assert first.close(timeout=30)
    with (tmp_path / "job.log").open("ab") as log:  # the job ran on while the agent was down
        log.write(f"two {TOKEN}\n".encode())
    again = LogShipper(client, "job-1", tmp_path / "job.log", flush_interval=0.01,
                       resume=True, secret_values=[TOKEN])  # fmt: skip
    assert again.close(timeout=30)
    assert bytes(store.data) == b"one ***\ntwo ***\n"


# -- fetching the values ----------------------------------------------------------------------


def assignment(secrets: Mapping[str, str]) -> Assignment:
    spec = JobSpec(repository_url="/r", entry_point=("t.py",), secrets=dict(secrets))
    return Assignment(job_id="job-1", name="job", status="building", spec=spec, node_index=1)


class Answering:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[tuple[str, int]] = []

    def job_secrets(self, job_id: str, node_index: int = 0) -> dict[str, str]:
        self.asked.append((job_id, node_index))
        if isinstance(self.answer, Exception):
            raise self.answer
        return dict(self.answer)


def fetched(answer: Any, secrets: Mapping[str, str]) -> Any:
    return fetch_secrets(Answering(answer), assignment(secrets))  # type: ignore[arg-type]


def test_a_job_without_secrets_asks_for_none() -> None:
    client = Answering({})
    assert fetch_secrets(client, assignment({})).values == {}  # type: ignore[arg-type]
    assert client.asked == []


def test_the_values_come_by_variable_and_are_never_in_the_repr() -> None:
    secrets = fetched({"HF_TOKEN": TOKEN}, {"HF_TOKEN": "hf"})
    assert secrets.values == {"HF_TOKEN": TOKEN} and secrets.failure is None
    assert secrets.masked == (TOKEN,)
    assert TOKEN not in repr(secrets)


def test_a_missing_secret_is_secret_not_found_naming_it_and_what_to_do() -> None:
    problem = {"type": "https://flexai.dev/problems/secret-not-found", "missing": ["wandb"]}
    secrets = fetched(ApiError(404, problem), {"HF_TOKEN": "hf", "WANDB_KEY": "wandb"})
    assert secrets.failure is not None and secrets.failure.code == "secret_not_found"
    assert "'wandb' (for WANDB_KEY)" in secrets.failure.message
    assert "`flexai secret create wandb`" in secrets.failure.message


@pytest.mark.parametrize("error", [
    ApiError(409, {"type": "https://flexai.dev/problems/job-not-running", "detail": "stopped"}),
    ApiUnavailable("cannot reach the control plane"),
])  # fmt: skip
def test_values_that_cannot_be_had_are_secret_unavailable(error: Exception) -> None:
    secrets = fetched(error, {"HF_TOKEN": "hf"})
    assert secrets.failure is not None and secrets.failure.code == "secret_unavailable"
    assert secrets.values == {}


def test_the_client_asks_for_the_job_and_node_it_runs(tmp_path: Path) -> None:
    seen: list[str] = []

    def answer(method: str, path: str, headers: Any, body: bytes) -> Any:
        seen.append(f"{method} {path}")
        return 200, {"secrets": {"HF_TOKEN": TOKEN}}, {}

    server = serve_json(answer)
    client = ControlPlaneClient(server_url(server), "t0ken")
    try:
        assert fetch_secrets(client, assignment({"HF_TOKEN": "hf"})).values == {"HF_TOKEN": TOKEN}
    finally:
        client.close()
        server.shutdown()
    assert seen == ["GET /v1/agent/jobs/job-1/secrets?node_index=1"]
