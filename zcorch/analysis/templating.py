"""The Jinja2 environment of the report's and the history page's templates: a module of its own, so that a page
renders without importing zcorch.analysis.report and, through it, matplotlib."""
from __future__ import annotations

import functools

import jinja2
import numpy as np

from zcorch.analysis.links import anchor_href, href, path_href


def text(value) -> str:
    """A value as the report shows it (the `text` filter): NaN as nothing, an integral float as that integer."""
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        if np.isnan(value):
            return ""
        if float(value).is_integer():
            value = int(value)
    return str(value)


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The environment (one per process: its templates are compiled once)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("zcorch.analysis", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["text"] = text
    # every href/src goes through one of these: http(s) URLs or relative paths only (zcorch.analysis.links)
    env.filters.update(href=href, path_href=path_href, anchor_href=anchor_href)
    return env
