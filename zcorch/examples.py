"""The experiment files and the notebook zcorch ships, wherever it is installed (`zcorch examples`).

A wheel or sdist install carries them as package data (zcorch/_examples/, copied there by setup.py from the
checkout's experiments/ and notebooks/); a checkout or an editable install reads those folders themselves.
Copying one out never overwrites a file (exclusive create) and never follows a link at the destination.
"""
from __future__ import annotations

import os
from typing import Dict, List, NamedTuple

from zcorch.errors import ConfigError, ZcorchError

_DATA = "_examples"


class Example(NamedTuple):
    name: str         # quickstart, schutt-2006, analysis (the notebook)
    filename: str     # quickstart.yaml, analysis.ipynb
    path: str         # where this installation keeps it
    kind: str         # "experiment" or "notebook"
    description: str  # the experiment's `description:` (first sentence), or the notebook's


def _dirs() -> List[str]:
    import importlib.resources

    package = os.fspath(importlib.resources.files("zcorch"))
    data = os.path.join(package, _DATA)
    if os.path.isdir(data):
        return [data]
    checkout = os.path.dirname(package)
    return [os.path.join(checkout, d) for d in ("experiments", "notebooks")]


def _description(path: str) -> str:
    if path.endswith(".ipynb"):
        return "the analysis notebook: load a result set, the seeds' table, summaries and the report's plots"
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError):
        return ""
    text = " ".join(str(doc.get("description") or "").split())
    return text.split(". ")[0].rstrip(".")


def examples() -> Dict[str, Example]:
    """Every shipped example by name, experiments first."""
    found: Dict[str, Example] = {}
    for d in _dirs():
        for filename in sorted(os.listdir(d)) if os.path.isdir(d) else ():
            stem, ext = os.path.splitext(filename)
            if ext not in (".yaml", ".ipynb"):
                continue
            path = os.path.join(d, filename)
            found[stem] = Example(stem, filename, path, "notebook" if ext == ".ipynb" else "experiment",
                                  _description(path))
    if not found:
        raise ZcorchError("this installation carries no examples (reinstall zcorch from a wheel or sdist)")
    return dict(sorted(found.items(), key=lambda kv: (kv[1].kind != "experiment", kv[0] != "quickstart", kv[0])))


def copy_example(name: str, directory: str) -> str:
    """Write example `name` into `directory` (made if missing) under its file name; the path written.
    ConfigError (an input error, exit 2) for an unknown name, a file that exists (nothing is overwritten) or a
    directory it cannot write in."""
    known = examples()
    if name not in known and name.rsplit(".", 1)[0] in known:
        name = name.rsplit(".", 1)[0]
    if name not in known:
        raise ConfigError(f"no example {name!r} (known: {', '.join(known)})")
    ex = known[name]
    dest = os.path.join(directory, ex.filename)
    with open(ex.path, "rb") as f:
        data = f.read()
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        raise ConfigError(f"{dest} exists: not overwritten (remove it or choose another directory)") from None
    except OSError as exc:
        raise ConfigError(f"{dest}: cannot write it ({exc.strerror or exc})") from None
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return dest
