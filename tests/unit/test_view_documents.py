"""The views' JSON text (projections.documents.dump_json): what json.loads reads back, for
every value a document can hold."""

from __future__ import annotations

import json
from typing import Any

import pytest

from projections.documents import dump_json


@pytest.mark.parametrize(
    "value",
    [
        {"id": "j", "history": [{"facts": {"exit_code": 0, "loss": 0.1, "step": 10**18}}]},
        {"name": "café \u2028 ✓", "quote": 'a "b" \\ c', "control": "\x00\x1f"},
        {"tiny": 1e-05, "huge": 1e300, "negative": -(2**63), "top": 2**64 - 1},
        [1, [2, [3, {"deep": None}]], True, False],
    ],
)
def test_what_it_writes_reads_back_as_the_same_value(value: Any) -> None:
    text = dump_json(value)
    assert json.loads(text) == value


def test_the_text_is_compact_with_utf8_as_it_is() -> None:
    assert dump_json({"a": 1, "b": [1, 2], "c": "é"}) == '{"a":1,"b":[1,2],"c":"é"}'


@pytest.mark.parametrize(
    "value",
    [{"count": 2**70}, {"count": -(2**63) - 1}, {1: "a key that is not a string"}],
)
def test_what_orjson_refuses_the_standard_library_writes(value: Any) -> None:
    text = dump_json(value)
    assert text == json.dumps(value)
    assert json.loads(text) == json.loads(json.dumps(value))


def test_a_nan_or_an_infinity_is_written_as_null_valid_json() -> None:
    assert json.loads(dump_json({"a": float("nan"), "b": float("inf")})) == {"a": None, "b": None}
