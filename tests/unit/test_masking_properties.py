"""The masked log is one ``re.sub`` over the whole log, whatever the chunks, the values and
the pauses: checked against that one-shot replacement over random values, random text and
random cuts, with what the mask holds back never more than could still begin a value."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from node_agent.logs.masking import MASK, PrefixAutomaton, SecretMask

# A small alphabet, so that values overlap, repeat and hide in one another often.
ALPHABET = b"ab\nc"
values_strategy = st.lists(st.binary(min_size=1, max_size=8).map(
    lambda raw: bytes(ALPHABET[byte % len(ALPHABET)] for byte in raw)), min_size=1, max_size=5)
text_strategy = st.binary(max_size=200).map(
    lambda raw: bytes(ALPHABET[byte % len(ALPHABET)] for byte in raw))


def one_shot(data: bytes, values: list[bytes]) -> bytes:
    ordered = sorted(set(values), key=len, reverse=True)
    return re.sub(b"|".join(map(re.escape, ordered)), MASK, data)


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(point, len(data)) for point in cuts})
    edges = [0, *points, len(data)]
    return [data[start:end] for start, end in zip(edges, edges[1:], strict=False)]


def could_begin_a_value(held: bytes, values: list[bytes]) -> bool:
    return any(len(held) < len(value) and value.startswith(held) for value in values)


@settings(max_examples=400, deadline=None)
@given(values=values_strategy, data=text_strategy, cuts=st.lists(st.integers(0, 200)))
def test_the_masked_stream_is_the_one_shot_replacement_whatever_the_chunks(
    values: list[bytes], data: bytes, cuts: list[int]
) -> None:
    mask, out = SecretMask(values), bytearray()
    for chunk in cut(data, cuts):
        out += mask.feed(chunk)
    out += mask.feed(b"", final=True)
    assert bytes(out) == one_shot(data, values)


@settings(max_examples=400, deadline=None)
@given(values=values_strategy, data=text_strategy, cuts=st.lists(st.integers(0, 200)))
def test_after_each_chunk_only_a_possible_beginning_of_a_value_is_held(
    values: list[bytes], data: bytes, cuts: list[int]
) -> None:
    mask, fed = SecretMask(values), b""
    for chunk in cut(data, cuts):
        mask.feed(chunk)
        fed += chunk
        held = fed[len(fed) - mask.held :] if mask.held else b""
        assert mask.held == 0 or could_begin_a_value(held, values)
        # ... and nothing shorter would do: the held bytes start at the first open position
        # the scan could reach, so a longer open suffix than the held one was decided already.
        assert mask.held <= max(
            (n for n in range(len(fed) + 1) if could_begin_a_value(fed[len(fed) - n :], values)),
            default=0,
        )


@settings(max_examples=300, deadline=None)
@given(values=values_strategy, data=text_strategy)
def test_a_value_fed_byte_by_byte_is_masked_and_never_shipped(
    values: list[bytes], data: bytes
) -> None:
    value = values[0]
    stream = data + value + data
    mask, out = SecretMask(values), bytearray()
    for index in range(len(stream)):
        out += mask.feed(stream[index : index + 1])
    out += mask.feed(b"", final=True)
    assert bytes(out) == one_shot(stream, values)


@settings(max_examples=300, deadline=None)
@given(values=values_strategy, text=text_strategy)
def test_the_automaton_names_every_suffix_that_is_a_proper_prefix_of_a_value(
    values: list[bytes], text: bytes
) -> None:
    expected = [n for n in range(len(text), 0, -1)
                if could_begin_a_value(text[len(text) - n :], values)]  # fmt: skip
    assert PrefixAutomaton(values).open_suffixes(text) == [*expected, 0]
