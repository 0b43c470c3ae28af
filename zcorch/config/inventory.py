"""Inventory files: named pairs of hosts kept apart from the experiments (`zcorch run EXP --hosts FILE[:PAIR]`,
docs/experiment-files.md), each pair parsed by the `hosts:` parser; paths relative to the file are made absolute.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence, Tuple

from zcorch.config import yamlsrc as ys
from zcorch.config.checks import NAME_RE, NAME_RULE, Checker, read_document, suggest
from zcorch.config.hosts import Hosts, parse_hosts
from zcorch.errors import ConfigError

ENV_VAR = "ZCORCH_HOSTS"
FLAG = "--hosts"
TOP_KEYS = ("pairs",)
SHARES_KEY = "shares"          # a pair's key beside sender/receiver: what its transfers share with other pairs
ALL_PAIRS = "all"              # `--hosts FILE:all`: every pair of the file (so no pair may be named `all`)


@dataclass(frozen=True)
class InventoryPair:
    """One pair chosen from an inventory file: its hosts (validated, paths absolute) and where it came from."""

    path: str                     # the inventory file, absolute
    sha256: str                   # of the file's bytes when it was read
    pair: str                     # the pair's name
    hosts: Hosts
    pairs: "tuple[str, ...]"      # every pair of the file, in file order
    shares: "tuple[str, ...]" = ()   # the pair's `shares:` names (links/switches it shares with other pairs)

    def record(self) -> dict:
        """What a result set records (manifest.json `inventory`)."""
        return {"path": self.path, "sha256": self.sha256, "pair": self.pair}

    def describe(self) -> str:
        return f"pair `{self.pair}` of {self.path}"


@dataclass(frozen=True)
class Inventory:
    path: str
    sha256: str
    pairs: "dict[str, Hosts]"     # name -> hosts, in file order
    shares: "dict[str, tuple[str, ...]]" = field(default_factory=dict)   # name -> its `shares:` (absent: none)

    def pair(self, name: Optional[str] = None, label: str = FLAG) -> InventoryPair:
        """The pair `name`, or (None) the only or first pair. ConfigError for an unknown name, listing the pairs."""
        return self.select([next(iter(self.pairs)) if name is None else name], label)[0]

    def select(self, names: Optional[Sequence[str]], label: str = FLAG) -> "List[InventoryPair]":
        """The pairs `names` in that order (None: every pair); ConfigError for unknown or repeated ones."""
        names = list(self.pairs) if names is None else names
        problems = [f"{label}: pair `{n}` is named twice" for i, n in enumerate(names) if n in names[:i]]
        problems += [f"{label}: {self.path} has no pair `{n}`{suggest(n, tuple(self.pairs))} "
                     f"(its pairs: {', '.join(self.pairs)})" for n in names if n not in self.pairs]
        if problems:
            raise ConfigError(problems)
        return [InventoryPair(self.path, self.sha256, n, self.pairs[n], tuple(self.pairs), self.shares.get(n, ()))
                for n in names]


def load_inventory(path: str) -> Inventory:
    """Read and validate an inventory file; ConfigError lists every problem as file:line:column: key: message."""
    path = os.path.abspath(os.fspath(path))
    text, sha256 = ys.read_text(path, "the inventory file")
    from zcorch.config import ansible_inventory as ansible  # an Ansible inventory (YAML/INI, or --list JSON)

    kind = ansible.kind_of(text)
    if kind is not None:
        body, origin = ansible.pairs_yaml(path, text, kind)
        try:
            inv = parse_inventory(body, ansible.synthetic_name(path), sha256)
        except ConfigError as exc:
            raise ConfigError(ansible.translate(exc.problems, path, origin)) from None
        return dataclasses.replace(inv, path=path)
    return parse_inventory(text, path, sha256)


def parse_inventory(text: str, path: str, sha256: str = "") -> Inventory:
    """Validate inventory text; relative paths in it are relative to `path`'s directory."""
    chk, root = read_document(text, path, document="an inventory file",
                              empty="an inventory needs `pairs:` with at least one pair")
    if not isinstance(root, ys.YMap):
        chk.problem(root.pos, "", f"expected a mapping with `pairs:`, got {ys.describe(root)}")
        chk.raise_if_any()
    top = chk.mapping(root, "", TOP_KEYS, "top-level keys of an inventory")
    pairs: "dict[str, Hosts]" = {}
    shares: "dict[str, tuple[str, ...]]" = {}
    if "pairs" not in top:
        chk.problem(root.pos, "pairs", "missing required key `pairs` (name: {sender: ..., receiver: ...})")
    else:
        node = top["pairs"][1]
        entries = node.entries if isinstance(node, ys.YMap) else {}
        if not isinstance(node, ys.YMap):
            chk.problem(node.pos, "pairs", f"expected a mapping of pair names to hosts, got {ys.describe(node)}")
        elif not entries:
            chk.problem(node.pos, "pairs", "no pair defined")
        base_dir = os.path.dirname(path)
        for name, (kpos, child) in entries.items():
            if not NAME_RE.match(name):
                chk.problem(kpos, f"pairs.{name}", f"`{name}` is not a valid pair name ({NAME_RULE})")
                continue
            if isinstance(child, ys.YScalar) and child.is_null:
                chk.problem(child.pos, f"pairs.{name}", "expected `localhost` or a mapping with `sender:` and "
                                                         "`receiver:`, got nothing (null)")
                continue
            if name == ALL_PAIRS:
                chk.problem(kpos, f"pairs.{name}", f"`{ALL_PAIRS}` is reserved: `--hosts FILE:{ALL_PAIRS}` "
                                                   "selects every pair; rename this one")
                continue
            if isinstance(child, ys.YMap) and SHARES_KEY in child.entries:
                _, snode = child.entries[SHARES_KEY]
                names = _share_names(chk, snode, f"pairs.{name}.{SHARES_KEY}")
                if names:
                    shares[name] = names
                child = ys.YMap({k: v for k, v in child.entries.items() if k != SHARES_KEY}, child.pos)
            hosts = parse_hosts(chk, child, f"pairs.{name}", base_dir=base_dir)
            if hosts is not None:
                pairs[name] = hosts
    chk.raise_if_any()
    return Inventory(path, sha256, pairs, shares)


def _share_names(chk: Checker, node: ys.YNode, key: str) -> "tuple[str, ...]":
    """`shares: NAME` or `shares: [NAME, ...]` -> the names (problems go to `chk`)."""
    items = node.items if isinstance(node, ys.YSeq) else [node]
    out: "list[str]" = []
    for item in items:
        if not isinstance(item, ys.YScalar) or item.is_null:
            chk.problem(item.pos, key, f"expected a name or a list of names (a link or switch the pair shares "
                                       f"with other pairs), got {ys.describe(item)}")
            continue
        text = chk.value(item, key, ys.as_str, None)
        if text is None:
            continue
        if not NAME_RE.match(text):
            chk.problem(item.pos, key, f"`{text}` is not a valid name ({NAME_RULE})")
        elif text not in out:
            out.append(text)
    return tuple(out)


def split_spec(spec: str) -> "tuple[str, Optional[str]]":
    """`FILE[:PAIR]` -> (file, pair or None). A file that exists under the whole name is a file."""
    if os.path.exists(spec) or ":" not in spec:
        return spec, None
    path, pair = spec.rsplit(":", 1)
    return path, (pair or None)


def is_fleet_spec(spec: Optional[str]) -> bool:
    """`FILE:PAIR1,PAIR2...` or `FILE:all`: a fleet run, one sweep per pair (zcorch.sweep.fleet)."""
    name = split_spec(spec)[1] if spec else None
    return name is not None and (name == ALL_PAIRS or "," in name)


def select_pairs(spec: str, label: str = FLAG) -> "Tuple[Inventory, List[InventoryPair]]":
    """The inventory of `FILE:PAIR1,PAIR2...` / `FILE:all` / `FILE[:PAIR]` and the pairs it names."""
    if not spec:
        raise ConfigError(f"{label}: expected INVENTORY:PAIR1,PAIR2... or INVENTORY:all, got an empty value")
    path, name = split_spec(spec)
    inv = _load_for(path, spec, label)
    if name == ALL_PAIRS:
        return inv, inv.select(None, f"{label} {spec}")
    if name is None:
        return inv, [inv.pair(None, f"{label} {spec}")]
    names = [n.strip() for n in name.split(",")]
    if "" in names:
        raise ConfigError(f"{label} {spec}: an empty pair name (write FILE:PAIR1,PAIR2)")
    return inv, inv.select(names, f"{label} {spec}")


def _load_for(path: str, spec: str, label: str) -> Inventory:
    try:
        return load_inventory(path)
    except ConfigError as exc:
        if len(exc.problems) == 1 and "cannot read the inventory file" in exc.problems[0]:
            raise ConfigError(f"{label} {spec}: {exc.problems[0]}") from None
        raise


def complete_spec(prefix: str) -> List[str]:
    """The --hosts values completing `prefix` (`FILE:` + each pair, `all`); a completion never fails."""
    if ":" not in prefix:
        return []
    path, typed = prefix.rsplit(":", 1)
    try:
        inv = load_inventory(path)
    except (ConfigError, OSError):
        return []
    done, comma, last = typed.rpartition(",")
    named = done.split(",") if comma else []
    names = [n for n in inv.pairs if n not in named] + ([] if comma else [ALL_PAIRS])
    return [f"{path}:{done}{comma}{n}" for n in names if n.startswith(last)]


def select(spec: str, label: str = FLAG) -> InventoryPair:
    """The pair `FILE[:PAIR]` names (the only or first pair without PAIR); `label` names the source in errors."""
    if not spec:
        raise ConfigError(f"{label}: expected INVENTORY[:PAIR], got an empty value")
    path, name = split_spec(spec)
    if is_fleet_spec(spec):
        raise ConfigError(f"{label} {spec}: several pairs (a fleet) are run by `zcorch run` only")
    return _load_for(path, spec, label).pair(name, f"{label} {spec}")


def from_environment(flag: Optional[str], environ: Mapping[str, str]) -> Optional[InventoryPair]:
    """The pair of `--hosts` if given, else of ZCORCH_HOSTS if set and not empty, else None."""
    if flag is not None:
        return select(flag, FLAG)
    value = environ.get(ENV_VAR)
    return select(value, ENV_VAR) if value else None
