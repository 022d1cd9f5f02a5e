"""The console's own files keep to its Content-Security-Policy and never turn a job's text into
markup: no inline script or style in a template, no HTML parsing in its script."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CONSOLE = Path(__file__).resolve().parents[2] / "api" / "console"
TEMPLATES = sorted((CONSOLE / "templates").glob("*.html"))


def test_the_script_inserts_text_and_never_parses_markup_or_code() -> None:
    script = (CONSOLE / "static" / "console.js").read_text()
    for parser in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                   "new Function", "DOMParser", "createContextualFragment"):  # fmt: skip
        assert parser not in script, parser
    assert "createTextNode" in script and "textContent" in script


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda path: path.name)
def test_no_template_holds_inline_script_style_or_handlers(template: Path) -> None:
    text = template.read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", text) == []
    assert re.findall(r"<style\b|\sstyle=|\son[a-z]+=|javascript:", text) == []
    assert "|safe" not in text and "autoescape false" not in text
