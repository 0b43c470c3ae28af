"""Ansible inventories as zcorch inventories (`--hosts INV[:PAIR]`): `ansible-inventory --list` JSON, or YAML and
INI files read by ansible-core. No inventory script or plugin configuration is ever executed: ansible-inventory
runs with only the yaml and ini plugins, in a private cwd and config, with time, memory and output limits."""
from __future__ import annotations

import graphlib
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

import yaml

from zcorch.errors import ConfigError

ROLES = ("sender", "receiver")
# zcorch host key -> the Ansible variable that gives it (ssh is built from ansible_host/user/port)
HOST_VARS = {"data_address": "zcorch_data_address", "identity_file": "ansible_ssh_private_key_file",
             "python": "ansible_python_interpreter", "known_hosts": "zcorch_known_hosts",
             "ssh_config": "zcorch_ssh_config", "workdir": "zcorch_workdir",
             "allow_network_changes": "zcorch_allow_network_changes"}
SSH_VARS = "ansible_host, ansible_user, ansible_port"
ENABLED_PLUGINS = "yaml,ini"
# ansible-inventory reads someone's file: limits on time, address space (a YAML alias bomb) and output.
TIMEOUT_S = 60
MEMORY_LIMIT = 1 << 30          # RLIMIT_AS of the ansible-inventory process
OUTPUT_LIMIT = 64 << 20         # RLIMIT_FSIZE: its --list JSON goes to a file in its private directory
# The JSON of an inventory: at most this many bytes, this deep, and this many groups.
JSON_MAX_BYTES = 64 << 20
JSON_MAX_DEPTH = 64
MAX_GROUPS = 20000
_GROUP_KEYS = ("hosts", "children", "vars")


def kind_of(text: str) -> Optional[str]:
    """'json', 'ansible' (a YAML or INI file), 'script' or None (zcorch's own inventory, or not one)."""
    if text.startswith("#!"):   # a program (a dynamic inventory script): refused by load_ansible, never run
        return "script"
    stripped = text.lstrip()
    if stripped.startswith("{"):
        if json_problem(stripped):
            return "json"           # load_json refuses it with the reason
        try:
            doc = json.loads(stripped)
        except (ValueError, RecursionError):
            return None
        return "json" if isinstance(doc, dict) and ("_meta" in doc or "all" in doc) else None
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))   # libyaml: a tenth of the CPU
    except yaml.YAMLError:
        doc = None
    if isinstance(doc, dict):
        if "pairs" in doc:
            return None
        groups = [v for v in doc.values() if isinstance(v, dict) and any(k in v for k in _GROUP_KEYS)]
        return "ansible" if groups else None
    # INI: section headers ([group], [group:vars]) or bare host lines (YAML reads a string, a list, or refuses)
    return "ansible" if re.search(r"^\s*\[[^\]]+\]\s*$", text, re.M) else None


def ansible_inventory_command() -> str:
    """The ansible-inventory of this Python's environment (or on PATH); ConfigError saying how to get it."""
    here = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
    exe = here if os.access(here, os.X_OK) else shutil.which("ansible-inventory")
    if not exe:
        raise ConfigError("reading an Ansible YAML/INI inventory needs ansible-core: pip install 'zcorch[ansible]' "
                          "(or pass the JSON that `ansible-inventory -i FILE --list` prints)")
    return exe


def inventory_env(private: str) -> Dict[str, str]:
    """The environment ansible-inventory runs with: none of the caller's `ANSIBLE_*`, an empty private config,
    Ansible's directories inside `private`, only the yaml and ini inventory and host_group_vars plugins."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    empty = os.path.join(private, "empty")
    os.makedirs(empty, mode=0o700, exist_ok=True)
    config = os.path.join(private, "ansible.cfg")
    open(config, "w").close()
    env.update(ANSIBLE_CONFIG=config, ANSIBLE_HOME=private, ANSIBLE_LOCAL_TEMP=os.path.join(private, "tmp"),
               ANSIBLE_INVENTORY_ENABLED=ENABLED_PLUGINS, ANSIBLE_VARS_ENABLED="host_group_vars",
               ANSIBLE_VARS_PLUGINS=empty, ANSIBLE_INVENTORY_PLUGINS=empty, ANSIBLE_COLLECTIONS_PATH=empty,
               ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False", ANSIBLE_NOCOLOR="1",
               ANSIBLE_INVENTORY_UNPARSED_FAILED="1", ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    return env


def _limits() -> None:   # in the child, before exec
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT, OUTPUT_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def list_json(path: str) -> dict:
    """`ansible-inventory -i PATH --list` of a YAML or INI file, run confined (inventory_env, limits)."""
    import signal
    import tempfile

    exe = ansible_inventory_command()
    source = os.path.abspath(path)
    with tempfile.TemporaryDirectory(prefix="zcorch-ansible-") as private:
        out_path = os.path.join(private, "list.json")
        try:
            with open(out_path, "w") as out:
                proc = subprocess.Popen([exe, "-i", source, "--list"], stdout=out, stderr=subprocess.PIPE,
                                        stdin=subprocess.DEVNULL, cwd=private, env=inventory_env(private),
                                        preexec_fn=_limits, start_new_session=True, text=True)
                try:
                    _, err = proc.communicate(timeout=TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate()
                    raise ConfigError(f"{path}: ansible-inventory did not finish within {TIMEOUT_S} s: refused "
                                      "(an inventory whose groups or YAML aliases expand without end?)") from None
                finally:
                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
        except OSError as exc:
            raise ConfigError(f"{path}: ansible-inventory could not read it: {exc}") from None
        if proc.returncode != 0:
            lines = [ln.strip() for ln in (err or "").splitlines() if ln.strip()]
            why = {-signal.SIGXFSZ: f"its output passed {OUTPUT_LIMIT >> 20} MiB",
                   -signal.SIGKILL: "it was killed"}.get(proc.returncode)
            if why is None and any("MemoryError" in ln for ln in lines):
                why = f"it ran out of its {MEMORY_LIMIT >> 20} MiB of memory (a YAML alias bomb?)"
            raise ConfigError(f"{path}: not an Ansible inventory ansible-core can read as YAML or INI: "
                              + (why or (" ".join(lines[-3:]) if lines else f"exit {proc.returncode}")))
        with open(out_path, "rb") as f:
            text = f.read(JSON_MAX_BYTES + 1).decode("utf-8", "replace")
    return load_json(text, f"{path} (ansible-inventory --list)")


def json_problem(text: str) -> Optional[str]:
    """Why `text` is not JSON of a bounded inventory (too large, nested too deep), or None."""
    if len(text) > JSON_MAX_BYTES:
        return f"larger than {JSON_MAX_BYTES >> 20} MiB"
    depth = 0
    # a string (its closing quote optional: an unterminated one is consumed once, linear), or a bracket
    for m in re.finditer(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[{]|[\]}]', text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > JSON_MAX_DEPTH:
                return f"nested more than {JSON_MAX_DEPTH} levels deep"
        elif c in "]}":
            depth -= 1
    return None


def load_json(text: str, path: str) -> dict:
    """An inventory's JSON, refused with the reason (ConfigError) when json_problem has one or it does not parse."""
    why = json_problem(text)
    if why:
        raise ConfigError(f"{path}: refused: the inventory JSON is {why}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None


def host_vars(doc: dict, path: str) -> Dict[str, dict]:
    """host -> its variables from `ansible-inventory --list` JSON: group vars (outermost first) under its own."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected the JSON object `ansible-inventory --list` prints")
    meta = doc.get("_meta") or {}
    hostvars = meta.get("hostvars") or {}
    if not isinstance(hostvars, dict):
        raise ConfigError(f"{path}: _meta.hostvars: expected an object of hosts")
    groups = {k: v for k, v in doc.items() if k != "_meta"}
    parents: Dict[str, List[str]] = {}
    members: Dict[str, List[str]] = {}
    for name, group in groups.items():
        if isinstance(group, list):           # the short form of a dynamic inventory script: a list of hosts
            group = {"hosts": group}
        if not isinstance(group, dict):
            raise ConfigError(f"{path}: group `{name}`: expected an object with hosts/children/vars")
        for child in group.get("children") or []:
            parents.setdefault(str(child), []).append(name)
        for host in group.get("hosts") or []:
            members.setdefault(str(host), []).append(name)
            hostvars.setdefault(str(host), {})
        groups[name] = group

    if len(groups) > MAX_GROUPS:
        raise ConfigError(f"{path}: {len(groups)} groups: more than the {MAX_GROUPS} zcorch reads")
    depths = _group_depths(groups, parents, path)

    def ancestors(g: str, out: set) -> set:
        todo = [g]
        while todo:       # iterative: a chain of thousands of groups is no deeper for Python's stack
            for p in parents.get(todo.pop(), []):
                if p not in out:
                    out.add(p)
                    todo.append(p)
        return out

    result = {}
    for host, own in hostvars.items():
        if not isinstance(own, dict):
            raise ConfigError(f"{path}: _meta.hostvars.{host}: expected an object of variables")
        names = set(members.get(host, [])) | {"all"}
        for g in list(names):
            ancestors(g, names)
        merged: dict = {}
        for g in sorted(names, key=lambda g: (g != "all", depths.get(g, 0), g)):
            merged.update((groups.get(g) or {}).get("vars") or {})
        merged.update(own)
        result[str(host)] = merged
    return result


def _group_depths(groups: dict, parents: Dict[str, List[str]], path: str) -> Dict[str, int]:
    """group -> the longest chain of parents above it (linear); a cycle of groups is refused."""
    depths: Dict[str, int] = {}
    try:
        for g in graphlib.TopologicalSorter({g: parents.get(g, []) for g in [*groups, *parents]}).static_order():
            depths[g] = 1 + max((depths[p] for p in parents.get(g, [])), default=-1)
    except graphlib.CycleError as exc:
        raise ConfigError(f"{path}: group `{exc.args[1][0]}` is among its own children (a cycle of groups)") from None
    return depths


def _line_of(text: str, host: str) -> int:
    """The first line of `text` naming `host` (1 when none does)."""
    pat = re.compile(r"(^|[\s\"'\[:,{])" + re.escape(host) + r"($|[\s\"':,\]=}])")
    return next((i for i, line in enumerate(text.splitlines(), start=1) if pat.search(line)), 1)


def _boolean(value):
    """An INI file's `true`/`yes` is text to Ansible until a module reads it as a boolean: read it so here."""
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return value


def _ssh_target(host: str, v: dict) -> str:
    target = str(v.get("ansible_host") or host)
    if v.get("ansible_user") not in (None, ""):
        target = f"{v['ansible_user']}@{target}"
    if v.get("ansible_port") not in (None, ""):
        target = f"{target}:{v['ansible_port']}"
    return target


def pairs_document(hosts: Dict[str, dict], path: str,
                   text: str) -> Tuple[dict, Dict[tuple, Tuple[str, int]], List[str]]:
    """(a zcorch inventory document {"pairs": ...}, (pair, role) -> (host, line), problems)."""
    problems: List[str] = []
    found: Dict[str, Dict[str, List[str]]] = {}
    for host, v in hosts.items():
        pair = v.get("zcorch_pair")
        if pair in (None, ""):
            continue
        where = f"{path}:{_line_of(text, host)}: host `{host}`"
        role = v.get("zcorch_role")
        if role not in ROLES:
            problems.append(f"{where}: zcorch_role: expected `sender` or `receiver`, got "
                            + ("nothing" if role is None else repr(role)))
            continue
        found.setdefault(str(pair), {}).setdefault(role, []).append(host)
    if not found and not problems:
        problems.append(f"{path}: no host has the variable `zcorch_pair` (with `zcorch_role` sender or receiver "
                        "and `zcorch_data_address`): no zcorch pair in this Ansible inventory")
    doc: dict = {"pairs": {}}
    origin: Dict[tuple, Tuple[str, int]] = {}
    for pair in sorted(found):
        roles = found[pair]
        bad = False
        for role in ROLES:
            got = roles.get(role, [])
            if len(got) != 1:
                bad = True
                which = f"{len(got)}: " + ", ".join(f"`{h}`" for h in got) if got else "none"
                first = got[1] if len(got) > 1 else next(iter(roles.values()))[0]
                problems.append(f"{path}:{_line_of(text, first)}: pair `{pair}`: needs exactly one host with "
                                f"zcorch_role: {role}, has {which}")
        if bad:
            continue
        entry: dict = {}
        shares: List[str] = []
        for role in ROLES:
            host = roles[role][0]
            v = hosts[host]
            spec = {"ssh": _ssh_target(host, v)}
            for key, var in HOST_VARS.items():
                if v.get(var) is not None:
                    spec[key] = _boolean(v[var]) if key == "allow_network_changes" else v[var]
            entry[role] = spec
            origin[(pair, role)] = (host, _line_of(text, host))
            sh = v.get("zcorch_shares")
            if sh:
                shares += [str(s) for s in (sh if isinstance(sh, list) else [sh]) if str(s) not in shares]
        if shares:
            entry["shares"] = shares
        doc["pairs"][pair] = entry
    return doc, origin, problems


def _translate(problem: str, synthetic: str, path: str, origin: Dict[tuple, Tuple[str, int]]) -> str:
    """A problem the inventory parser found in the synthetic document, told in the Ansible file's terms."""
    m = re.match(re.escape(synthetic) + r":\d+(?::\d+)?: pairs\.([^.\s]+)\.(sender|receiver)(?:\.(\w+))?: (.*)$",
                 problem, re.S)
    if not m:
        m2 = re.match(re.escape(synthetic) + r":\d+(?::\d+)?: pairs\.([^.\s:]+)(?:\.(\w+))?: (.*)$", problem, re.S)
        if m2:
            return f"{path}: pair `{m2.group(1)}`" + (f": {m2.group(2)}" if m2.group(2) else "") + f": {m2.group(3)}"
        return problem.replace(synthetic, path)
    pair, role, key, msg = m.groups()
    host, line = origin.get((pair, role), ("?", 1))
    var = SSH_VARS if key == "ssh" else HOST_VARS.get(key, key or "")
    for k, v in HOST_VARS.items():   # "missing required key `data_address`": the variable that gives it
        msg = msg.replace(f"`{k}`", f"`{v}`")
    return f"{path}:{line}: host `{host}` (pair {pair}, {role}): {var + ': ' if var else ''}{msg}"


def synthetic_name(path: str) -> str:
    """The name the pairs document is parsed under (its directory is the inventory's: relative key paths)."""
    return f"{path} (as zcorch pairs)"


def pairs_yaml(path: str, text: str, kind: str) -> Tuple[str, Dict[tuple, Tuple[str, int]]]:
    """(a zcorch inventory document as YAML, (pair, role) -> (host, line)) of an Ansible inventory."""
    if kind == "json":
        doc = load_json(text, path)
    elif kind == "script":
        raise ConfigError(f"{path}: an executable inventory script: zcorch never runs it; run "
                          f"`ansible-inventory -i {path} --list > inventory.json` and pass inventory.json")
    else:
        doc = list_json(path)
    document, origin, problems = pairs_document(host_vars(doc, path), path, text)
    if problems:
        raise ConfigError(problems)
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False), origin


def translate(problems: List[str], path: str, origin: Dict[tuple, Tuple[str, int]]) -> List[str]:
    """The inventory parser's problems with the pairs document, told in the Ansible file's terms."""
    return [_translate(p, synthetic_name(path), path, origin) for p in problems]
