"""Which links the report and the history index make live. Jinja2's autoescape stops markup, not a
`javascript:` or `data:` URL in an href, so every href/src of the templates goes through a filter: `href` (a
URL someone wrote: only absolute http(s) is a link) or `path_href` (a relative path zcorch computed:
percent-encoded per component, so a colon is never a scheme; absolute or empty: no link).
"""
from __future__ import annotations

import re
from urllib.parse import quote, urlsplit

SCHEMES = ("http", "https")


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _plain(value: object) -> str:
    text = "" if value is None else str(value).strip()
    return "" if _CONTROL.search(text) else text


def href(value: object) -> str:
    """An absolute http(s) URL safe for href, or "" when `value` may not be a link."""
    text = _plain(value)
    try:
        parts = urlsplit(text)
    except ValueError:
        return ""
    if parts.scheme.lower() in SCHEMES and parts.netloc and not any(c in text for c in ' "<>`\\'):
        return text
    return ""


def path_href(value: object) -> str:
    """A relative path as an href ("" for an empty or absolute one): a colon in a name stays a path character."""
    text = _plain(value)
    if not text or text.startswith(("/", "\\")):
        return ""
    return quote(text, safe="/-._~")


def anchor_href(name: object) -> str:
    """`#name` for an in-page anchor."""
    return "#" + quote(_plain(name), safe="-._~")
