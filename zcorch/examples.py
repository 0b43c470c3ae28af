"""The experiment files, the notebook and the recipes zcorch ships (`zcorch examples`): package data in a wheel
(zcorch/_examples/), the checkout's experiments/, notebooks/ and contrib/ otherwise. Copying never overwrites
a file or a directory and never follows a link at the destination.
"""
from __future__ import annotations

import os
from typing import Dict, List, NamedTuple

from zcorch.errors import ConfigError, ZcorchError

_DATA = "_examples"


class Example(NamedTuple):
    name: str         # quickstart, schutt-2006, analysis (the notebook), nightly (a recipe)
    filename: str     # quickstart.yaml, analysis.ipynb, nightly (a directory)
    path: str         # where this installation keeps it
    kind: str         # "experiment", "notebook" or "recipe"
    description: str  # the experiment's `description:` (first sentence), the notebook's, a recipe's files


def _dirs() -> List[str]:
    import importlib.resources

    package = os.fspath(importlib.resources.files("zcorch"))
    data = os.path.join(package, _DATA)
    if os.path.isdir(data):
        return [data]
    checkout = os.path.dirname(package)
    return [os.path.join(checkout, d) for d in ("experiments", "notebooks", "contrib")]


def _description(path: str) -> str:
    if os.path.isdir(path):
        return "a directory: " + ", ".join(sorted(os.listdir(path)))
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
            path = os.path.join(d, filename)
            if os.path.isdir(path) and not filename.startswith((".", "_")):
                found[filename] = Example(filename, filename, path, "recipe", _description(path))
            elif ext in (".yaml", ".ipynb"):
                found[stem] = Example(stem, filename, path, "notebook" if ext == ".ipynb" else "experiment",
                                      _description(path))
    if not found:
        raise ZcorchError("this installation carries no examples (reinstall zcorch from a wheel or sdist)")
    order = ("experiment", "notebook", "recipe")
    return dict(sorted(found.items(), key=lambda kv: (order.index(kv[1].kind), kv[0] != "quickstart", kv[0])))


def copy_example(name: str, directory: str) -> str:
    """Write example `name` into `directory`, never overwriting; the path written (else ConfigError)."""
    known = examples()
    if name not in known and name.rsplit(".", 1)[0] in known:
        name = name.rsplit(".", 1)[0]
    if name not in known:
        raise ConfigError(f"no example {name!r} (known: {', '.join(known)})")
    ex = known[name]
    dest = os.path.join(directory, ex.filename)
    try:
        os.makedirs(directory, exist_ok=True)
        if ex.kind != "recipe":
            _write_new(ex.path, dest)
            return dest
        os.mkdir(dest, 0o755)   # exclusive: an existing directory (or a link) is not written into
        for filename in sorted(os.listdir(ex.path)):
            _write_new(os.path.join(ex.path, filename), os.path.join(dest, filename))
    except FileExistsError as exc:
        raise ConfigError(f"{exc.filename or dest} exists: not overwritten (remove it or choose another "
                          f"directory)") from None
    except OSError as exc:
        raise ConfigError(f"{exc.filename or dest}: cannot write it ({exc.strerror or exc})") from None
    return dest


def _write_new(src: str, dest: str) -> None:
    """Copy src to a new file dest; a script (#!) stays executable (package data carries no file modes)."""
    with open(src, "rb") as f:
        data = f.read()
    mode = 0o755 if data.startswith(b"#!") else 0o644
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
