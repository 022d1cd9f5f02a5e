"""Pages as HTML: the Jinja2 templates (autoescaped: every value from a job is text, never
markup) and the headers every console answer carries.

The Content-Security-Policy lets a page run only this server's own script and style files:
no inline script, no inline style, no ``eval``, no other origin, no framing.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.responses import HTMLResponse, RedirectResponse, Response

CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "connect-src 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
    "base-uri 'none'",
])  # fmt: skip
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_templates = Environment(
    loader=PackageLoader("api.console", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def query(**params: Any) -> str:
    """``?a=1&b=2`` of the parameters that have a value (lists repeat their key), or ''."""
    pairs = [(key, item) for key, value in params.items()
             for item in (value if isinstance(value, list | tuple) else [value])
             if item is not None and item != ""]  # fmt: skip
    return "?" + urlencode(pairs) if pairs else ""


_templates.globals["query"] = query


def secured(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


def page(template: str, status_code: int = 200, **context: Any) -> Response:
    """A page rendered from ``template`` with the console's headers."""
    html = _templates.get_template(template).render(**context)
    return secured(HTMLResponse(html, status_code=status_code))


def redirect(to: str) -> Response:
    """See other (303): after a form, the browser GETs ``to``."""
    return secured(RedirectResponse(to, status_code=303))


def problem_page(status_code: int, title: str, detail: str, signed: Any = None) -> Response:
    """An error as a page: what went wrong and what to do."""
    return page("problem.html", status_code, title=title, detail=detail, signed=signed)
