"""`--set KEY=VALUE`: the VALUE, read as flow YAML, grafted into the experiment's tree before the file's own
validator checks it. KEY: a dotted path, a parameter (its matrix axis, else `params.<name>`) or a linked axis."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from zcorch.config import yamlsrc as ys
from zcorch.config.checks import suggest
from zcorch.errors import ConfigError

FLAG = "--set"


@dataclass(frozen=True)
class Override:
    text: str            # KEY=VALUE exactly as given
    key: str
    value: ys.YNode      # positions: Pos(0, 0, source=label)

    @property
    def label(self) -> str:
        return f"{FLAG} {self.text}"


def parse_override(text: str) -> Override:
    """`KEY=VALUE` -> Override; ConfigError naming the --set for a malformed one or a YAML syntax error."""
    label = f"{FLAG} {text}"
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"{label}: expected KEY=VALUE (e.g. {FLAG} bytes=64MiB, {FLAG} baselines.dd.count=16, "
                          f"{FLAG} matrix.send_mode=[write,splice])")
    if any(part == "" for part in key.split(".")):
        raise ConfigError(f"{label}: `{key}` is not a key path (dotted names, e.g. baselines.dd.count)")
    if value.strip() == "":
        node: ys.YNode = ys.YScalar("", ys.NULL, True, ys.Pos(0, 0, label))
    else:
        node, problems = ys.parse(value, label, document="a --set value", empty="")
        if problems:
            raise ConfigError([f"{label}: {msg}" for _, _, msg in problems])
        assert node is not None
        node = ys.with_source(node, label)
    return Override(text, key, node)


def parse_overrides(texts: Iterable[str]) -> "list[Override]":
    """Every --set; all malformed ones reported together."""
    out, problems = [], []
    for text in texts:
        try:
            out.append(parse_override(text))
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)
    return out


def apply(root: ys.YMap, overrides: Sequence[Override], top_keys: Sequence[str], param_keys: Sequence[str]
          ) -> "tuple[ys.YMap, list[tuple[ys.Pos, str, str]], list[str]]":
    """(the root with the overrides grafted in, problems, the path each set); the file's tree is kept."""
    problems: "list[tuple[ys.Pos, str, str]]" = []
    targets: "list[str]" = []
    for ov in overrides:
        pos = ys.Pos(0, 0, ov.label)
        parts = ov.key.split(".")
        head = parts[0]
        if head in param_keys:
            if len(parts) > 1:
                problems.append((pos, ov.key, f"`{head}` is a parameter (one value): no key under it"))
                continue
            if isinstance(ov.value, ys.YSeq):
                problems.append((pos, ov.key, f"one value for every cell; to vary `{head}`, set a matrix axis: "
                                              f"{FLAG} matrix.{head}=[...]"))
                continue
            matrix = root.get("matrix")
            if isinstance(matrix, ys.YMap) and head in matrix.entries:
                parts, value = ["matrix", head], ys.YSeq([ov.value], pos)
            else:
                parts, value = ["params", head], ov.value
        elif head in top_keys:
            value = ov.value
        elif isinstance(root.get("matrix"), ys.YMap) and head in root.get("matrix").entries:
            # a linked axis of the matrix (its own name): its values, or one value (a mapping) alone
            if len(parts) > 1:
                problems.append((pos, ov.key, f"`{head}` is a linked axis: set its values whole "
                                              f"({FLAG} {head}=[{{...}}, ...])"))
                continue
            parts = ["matrix", head]
            value = ov.value if isinstance(ov.value, ys.YSeq) else ys.YSeq([ov.value], pos)
        else:
            problems.append((pos, ov.key, f"unknown key `{head}`{suggest(head, list(top_keys) + list(param_keys))} "
                                          f"(expected a top-level key ({', '.join(top_keys)}) or a parameter)"))
            continue
        new_root = _set(root, parts, value, pos, [], problems)
        if isinstance(new_root, ys.YMap):
            root = new_root
            targets.append(".".join(parts))
    return root, problems, targets


def _set(node: "ys.YNode | None", parts: "list[str]", value: ys.YNode, pos: ys.Pos, done: "list[str]",
         problems: list) -> "ys.YNode | None":
    """`node` with the path `parts` set to `value` (None: a problem was recorded)."""
    if not parts:
        return value
    where = ".".join(done) or "the document"
    if node is None or isinstance(node, ys.YScalar) and node.is_null and node.plain:
        node = ys.YMap({}, pos)
    if isinstance(node, ys.YSeq):
        problems.append((pos, ".".join(done), f"`{where}` is a list: set it whole ({FLAG} {where}=[...])"))
        return None
    if not isinstance(node, ys.YMap):
        problems.append((pos, ".".join(done), f"`{where}` is `{node.text}`, not a mapping: set it "
                                              f"whole ({FLAG} {where}={{...}})"))
        return None
    # A name may contain dots (a filesystem `xfs.v2`): the longest existing key wins.
    n = next((k for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in node.entries), 1)
    name = ".".join(parts[:n])
    kpos, child = node.entries.get(name, (pos, None))
    new_child = _set(child, parts[n:], value, pos, done + [name], problems)
    if new_child is None:
        return None
    return ys.YMap({**node.entries, name: (kpos, new_child)}, node.pos)
