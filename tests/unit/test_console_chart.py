"""The console's loss chart: every logged step of the newest checkpoint's trainer state, read
once per checkpoint, with the checkpoints' own losses where the history has none."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from api.artifacts.archives import ArchiveLimits
from api.console.chart import LossHistories, chart, curves_of, log_history


def archive(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name, text in files.items():
            bundle.writestr(name, text)
    return buffer.getvalue()


def state(history: list[dict[str, Any]]) -> str:
    return json.dumps({"global_step": 30, "log_history": history})


HISTORY = [
    {"step": 10, "loss": 1.2, "learning_rate": 0.001},
    {"step": 20, "loss": 0.9},
    {"step": 20, "eval_loss": 1.1, "eval_runtime": 3.2},
    {"step": 30, "loss": 0.7},
    {"train_runtime": 99.0, "step": 30},
]


def test_the_chart_has_one_marker_per_logged_step_of_each_series() -> None:
    drawn = chart(curves_of(HISTORY, []))
    assert drawn is not None
    assert [point["step"] for point in drawn["train"]["points"]] == ["10", "20", "30"]
    assert [point["loss"] for point in drawn["train"]["points"]] == ["1.2", "0.9", "0.7"]
    assert [point["step"] for point in drawn["eval"]["points"]] == ["20"]
    assert len(drawn["train"]["line"].split()) == 3
    ys = [float(point["y"]) for point in drawn["train"]["points"]]
    assert ys == sorted(ys), "a lower loss is drawn lower"


def test_steps_the_history_lacks_come_from_each_checkpoints_own_losses() -> None:
    rows = [{"step": 20, "train_loss": 5.0, "eval_loss": None},
            {"step": 40, "train_loss": 0.5, "eval_loss": 0.6}]  # fmt: skip
    curves = curves_of(HISTORY, rows)
    assert curves.train == {10.0: 1.2, 20.0: 0.9, 30.0: 0.7, 40.0: 0.5}
    assert curves.eval == {20.0: 1.1, 40.0: 0.6}


def test_values_that_are_not_finite_numbers_are_left_out() -> None:
    odd = [{"step": 1, "loss": float("nan")}, {"step": 2, "loss": "0.5"},
           {"step": True, "loss": 0.1}, {"step": 3, "loss": float("inf")}, {"loss": 0.2}]
    assert chart(curves_of(odd, [])) is None


def test_a_single_point_is_drawn_in_the_middle() -> None:
    drawn = chart(curves_of([{"step": 5, "loss": 0.3}], []))
    assert drawn is not None and len(drawn["train"]["points"]) == 1


def test_the_history_comes_from_the_shallowest_trainer_state_of_the_archive() -> None:
    data = archive({"checkpoint-30/nested/trainer_state.json": state([{"step": 1, "loss": 9}]),
                    "checkpoint-30/trainer_state.json": state(HISTORY),
                    "checkpoint-30/model.safetensors": "weights"})  # fmt: skip
    assert log_history(io.BytesIO(data), ArchiveLimits()) == HISTORY
    assert log_history(io.BytesIO(archive({"config.json": "{}"})), ArchiveLimits()) == []


class Store:
    """What the chart needs of the artifact store: a seekable reader by key."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.limits = ArchiveLimits()
        self.opened: list[str] = []

    @contextmanager
    def open(self, key: str) -> Iterator[IO[bytes]]:
        self.opened.append(key)
        yield io.BytesIO(self.objects[key])


def test_a_checkpoint_is_read_once_and_an_unreadable_one_leaves_the_views_figures() -> None:
    store = Store({"jobs/j1/checkpoints/c1.zip": archive({"trainer_state.json": state(HISTORY)}),
                   "jobs/j1/checkpoints/bad.zip": b"not a zip"})  # fmt: skip
    histories = LossHistories()
    assert histories.history(store, "j1", "c1") == HISTORY
    assert histories.history(store, "j1", "c1") == HISTORY
    assert store.opened == ["jobs/j1/checkpoints/c1.zip"]
    assert histories.history(store, "j1", "bad") == []
    assert histories.history(store, "j1", "gone") == []
