"""Which links the pages make live: autoescape stops markup, not a `javascript:` URL, so every href/src goes through
`href` (only absolute http(s)) or `path_href` (a relative path, percent-encoded: a colon is never a scheme)."""
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
    return text if parts.scheme.lower() in SCHEMES and parts.netloc and not any(c in text for c in ' "<>`\\') else ""


def path_href(value: object) -> str:
    """A relative path as an href ("" for an empty or absolute one): a colon in a name stays a path character."""
    text = _plain(value)
    return "" if not text or text.startswith(("/", "\\")) else quote(text, safe="/-._~")


def anchor_href(name: object) -> str:
    """`#name` for an in-page anchor."""
    return "#" + quote(_plain(name), safe="-._~")
