"""The loss chart of a job page: train and eval loss by step, drawn as server-side SVG.

The points come from the newest checkpoint's ``trainer_state.json``: its ``log_history`` holds
every entry the trainer logged up to that checkpoint (the Hugging Face trainer keeps the whole
history in each checkpoint), so one archive gives the whole curve. The store's reader is
seekable (ranged reads on S3): only the archive's directory and that small file are read, and
a checkpoint never changes, so what was read is kept by its id. Steps the history lacks (or a
checkpoint that cannot be read now) fall back to each checkpoint's own step and losses, as the
views hold them.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO, Any

from api.artifacts.archives import METADATA_MAX_BYTES, ArchiveLimits, open_archive
from api.artifacts.store import checkpoint_key

Point = tuple[float, float]
WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 12, 36
KEPT = 128
"""Checkpoints whose history is kept in memory (each a few thousand numbers at most)."""


def log_history(handle: IO[bytes], limits: ArchiveLimits) -> list[dict[str, Any]]:
    """The ``log_history`` of the archive's ``trainer_state.json`` (the shallowest one)."""
    with open_archive(handle, limits) as archive:
        found = sorted((info for info in archive.infolist()
                        if PurePosixPath(info.filename).name == "trainer_state.json"),
                       key=lambda info: len(info.filename))  # fmt: skip
        if not found or found[0].file_size > METADATA_MAX_BYTES:
            return []
        with archive.open(found[0]) as member:
            state = json.loads(member.read(METADATA_MAX_BYTES + 1))
    entries = state.get("log_history") if isinstance(state, dict) else None
    return [entry for entry in entries or [] if isinstance(entry, dict)]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass
class Curves:
    train: dict[float, float] = field(default_factory=dict)
    eval: dict[float, float] = field(default_factory=dict)

    def add(self, step: Any, train: Any = None, evaluation: Any = None) -> None:
        at = _number(step)
        if at is None:
            return
        if (loss := _number(train)) is not None:
            self.train.setdefault(at, loss)
        if (loss := _number(evaluation)) is not None:
            self.eval.setdefault(at, loss)


def curves_of(history: Iterable[Mapping[str, Any]], rows: Iterable[Mapping[str, Any]]) -> Curves:
    """Every logged step's losses, then the checkpoints' own for steps the history lacks."""
    curves = Curves()
    for entry in history:
        curves.add(entry.get("step"), entry.get("loss"), entry.get("eval_loss"))
    for row in rows:
        curves.add(row.get("step"), row.get("train_loss"), row.get("eval_loss"))
    return curves


class LossHistories:
    """The newest checkpoint's log history per job, read once per checkpoint."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def history(self, artifacts: Any, job_id: str, checkpoint_id: str) -> list[dict[str, Any]]:
        with self._lock:
            if checkpoint_id in self._kept:
                self._kept.move_to_end(checkpoint_id)
                return self._kept[checkpoint_id]
        try:
            with artifacts.open(checkpoint_key(job_id, checkpoint_id)) as handle:
                entries = log_history(handle, artifacts.limits)
        except Exception:  # noqa: BLE001 - unreadable now: the views' figures stand in
            return []
        with self._lock:
            self._kept[checkpoint_id] = entries
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        return entries


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    return [low + (high - low) * index / (count - 1) for index in range(count)]


def _label(value: float) -> str:
    return format(value, ".4g")


def chart(curves: Curves) -> dict[str, Any] | None:
    """The SVG's geometry: a polyline and a marker per point of each series, and the axes;
    None when no step has a loss."""
    points = [*curves.train.items(), *curves.eval.items()]
    if not points:
        return None
    steps = [step for step, _ in points]
    losses = [loss for _, loss in points]
    x_low, x_high = min(steps), max(steps)
    y_low, y_high = min(losses), max(losses)
    if y_high == y_low:
        y_low, y_high = y_low - 0.5, y_high + 0.5
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step: float) -> float:
        return LEFT + (plot_w / 2 if x_high == x_low else (step - x_low) / (x_high - x_low)
                       * plot_w)  # fmt: skip

    def y(loss: float) -> float:
        return TOP + (y_high - loss) / (y_high - y_low) * plot_h

    def series(values: dict[float, float]) -> dict[str, Any]:
        ordered = sorted(values.items())
        return {
            "line": " ".join(f"{x(step):.1f},{y(loss):.1f}" for step, loss in ordered),
            "points": [{"x": f"{x(step):.1f}", "y": f"{y(loss):.1f}", "step": _label(step),
                        "loss": _label(loss)} for step, loss in ordered],  # fmt: skip
        }

    return {
        "width": WIDTH, "height": HEIGHT, "left": LEFT, "top": TOP,
        "right": WIDTH - RIGHT, "bottom": HEIGHT - BOTTOM,
        "train": series(curves.train), "eval": series(curves.eval),
        "x_ticks": [{"at": f"{x(step):.1f}", "label": _label(step)}
                    for step in _ticks(x_low, x_high)],
        "y_ticks": [{"at": f"{y(loss):.1f}", "label": _label(loss)}
                    for loss in _ticks(y_low, y_high)],
    }  # fmt: skip
