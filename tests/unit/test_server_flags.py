"""`flexai server` flags: every limit is a flag, and a value out of bounds is one error line."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.server import _settings, main, parse
from api.settings import Limits


def test_every_limit_is_a_flag_with_its_default(tmp_path: Path) -> None:
    settings = _settings(parse(["--data-dir", str(tmp_path)]))
    assert settings.limits == Limits()
    changed = parse(["--data-dir", str(tmp_path), "--max-log-followers", "5",
                     "--max-archive-entries", "7", "--skip-event", "3", "--skip-event", "9"])
    settings = _settings(changed)
    assert (settings.limits.log_followers, settings.limits.archive_entries) == (5, 7)
    assert settings.skip_events == frozenset({3, 9})


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--max-request-bytes", "10"], "--max-request-bytes"),
     (["--database-wait", "0"], "--database-wait")],
)  # fmt: skip
def test_a_flag_out_of_bounds_is_one_error_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    assert main(["--data-dir", str(tmp_path / "data"), *flags]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {named}: ") and error.count("\n") == 1
    assert not (tmp_path / "data").exists()  # refused before anything was opened
