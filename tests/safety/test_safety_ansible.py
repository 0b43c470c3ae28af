"""Ansible inventories are read as data: ansible-inventory runs with an empty private config, a fresh cwd, no
`ANSIBLE_*` variable of the caller's, a time and a memory limit, and its JSON (like a JSON inventory file) is
refused past a size and depth, without recursion. Real ansible.cfg files, real vars plugins that would leave a
marker, real `zcorch plan` processes."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
import time

import pytest

from zcorch.config import ansible_inventory
from zcorch.config.inventory import load_inventory
from zcorch.errors import ConfigError

pytest.importorskip("ansible", reason="the test extras install ansible-core (zcorch[ansible])")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

INI = """[p1]
s ansible_host=10.77.0.2 zcorch_role=sender zcorch_data_address=10.78.0.2
r ansible_host=10.77.0.3 zcorch_role=receiver zcorch_data_address=10.78.0.3

[p1:vars]
zcorch_pair=p1
ansible_user=root
"""
EXPERIMENT = "name: a\nhosts: inventory\nparams: {}\n"


def _plugin(directory, marker, kind="vars") -> None:
    """A real Ansible plugin whose import writes `marker` (what the attacker's code would do as root)."""
    os.makedirs(directory, exist_ok=True)
    base = {"vars": ("ansible.plugins.vars", "BaseVarsPlugin", "VarsModule",
                     "    def get_vars(self, loader, path, entities, cache=True):\n        return {}\n"),
            "inventory": ("ansible.plugins.inventory", "BaseInventoryPlugin", "InventoryModule",
                          "    NAME = 'evil'\n    def verify_file(self, path):\n        return True\n")}[kind]
    with open(os.path.join(directory, "evil.py"), "w") as f:
        f.write(f"open({str(marker)!r}, 'w').write('ran')\nfrom {base[0]} import {base[1]}\n"
                f"class {base[2]}({base[1]}):\n{base[3]}")


@pytest.fixture
def setup(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "lab.ini").write_text(INI)
    (work / "exp.yaml").write_text(EXPERIMENT)
    return work, tmp_path / "MARKER"


def _plan(work, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zcorch", "plan", "exp.yaml", "--hosts", "lab.ini"], cwd=work,
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": REPO, **(env or {})})


@pytest.mark.slow
def test_an_ansible_cfg_in_the_cwd_runs_no_vars_plugin(setup):
    work, marker = setup
    (work / "ansible.cfg").write_text("[defaults]\nvars_plugins = ./vp\n")
    _plugin(work / "vp", marker)
    res = _plan(work)
    assert res.returncode == 0, res.stderr
    assert not marker.exists(), "the vars plugin of ./ansible.cfg ran"


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["ANSIBLE_CONFIG", "ANSIBLE_VARS_PLUGINS", "home ansible.cfg",
                                     "home plugin dir", "ANSIBLE_HOME", "inventory plugin"])
def test_no_plugin_configured_outside_zcorch_runs(setup, tmp_path, variant):
    work, marker = setup
    elsewhere = tmp_path / "elsewhere"
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    if variant == "ANSIBLE_CONFIG":
        _plugin(elsewhere / "vp", marker)
        (elsewhere / "my.cfg").write_text(f"[defaults]\nvars_plugins = {elsewhere / 'vp'}\n")
        env["ANSIBLE_CONFIG"] = str(elsewhere / "my.cfg")
    elif variant == "ANSIBLE_VARS_PLUGINS":
        _plugin(elsewhere / "vp", marker)
        env["ANSIBLE_VARS_PLUGINS"] = str(elsewhere / "vp")
    elif variant == "home ansible.cfg":
        _plugin(elsewhere / "vp", marker)
        (home / ".ansible.cfg").write_text(f"[defaults]\nvars_plugins = {elsewhere / 'vp'}\n")
    elif variant == "home plugin dir":
        _plugin(home / ".ansible" / "plugins" / "vars", marker)
    elif variant == "ANSIBLE_HOME":
        _plugin(elsewhere / "plugins" / "vars", marker)
        env["ANSIBLE_HOME"] = str(elsewhere)
    else:
        _plugin(elsewhere / "ip", marker, kind="inventory")
        env.update(ANSIBLE_INVENTORY_PLUGINS=str(elsewhere / "ip"), ANSIBLE_INVENTORY_ENABLED="evil,ini")
    res = _plan(work, env)
    assert res.returncode == 0, res.stderr
    assert not marker.exists(), f"a plugin configured by {variant} ran"


def _fake_ansible_inventory(tmp_path, monkeypatch, body: str) -> None:
    exe = tmp_path / "fake-ansible-inventory"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    monkeypatch.setattr(ansible_inventory, "ansible_inventory_command", lambda: str(exe))


def test_ansible_inventory_gets_a_private_cwd_config_and_no_ansible_variables(setup, tmp_path, monkeypatch):
    work, _ = setup
    seen = tmp_path / "seen"
    _fake_ansible_inventory(tmp_path, monkeypatch,
                            f'{{ pwd; env; echo "CFG:$(cat "$ANSIBLE_CONFIG" | wc -c)"; ulimit -v; }} > {seen}\n'
                            'echo \'{"_meta": {"hostvars": {}}, "all": {"children": []}}\'\n')
    monkeypatch.chdir(work)
    monkeypatch.setenv("ANSIBLE_VARS_PLUGINS", "/somewhere")
    monkeypatch.setenv("ANSIBLE_STRATEGY_PLUGINS", "/somewhere")
    with pytest.raises(ConfigError, match="no host has the variable `zcorch_pair`"):
        load_inventory(str(work / "lab.ini"))
    lines = seen.read_text().splitlines()
    assert lines[0] != str(work) and os.path.basename(lines[0]).startswith("zcorch-ansible-")
    assert not os.path.exists(lines[0])                                 # the private directory is gone again
    env = dict(line.split("=", 1) for line in lines[1:-2] if "=" in line)
    assert env["ANSIBLE_CONFIG"].startswith(lines[0] + "/") and lines[-2] == "CFG:0"    # empty, private
    assert "/somewhere" not in env.values() and "ANSIBLE_STRATEGY_PLUGINS" not in env
    assert int(lines[-1]) * 1024 == ansible_inventory.MEMORY_LIMIT       # ulimit -v: KiB


@pytest.mark.slow
def test_a_hanging_ansible_inventory_is_stopped_with_its_children(setup, tmp_path, monkeypatch):
    work, _ = setup
    pidfile = tmp_path / "pid"
    _fake_ansible_inventory(tmp_path, monkeypatch, f"sleep 600 & echo $! > {pidfile}\nwait\n")
    monkeypatch.setattr(ansible_inventory, "TIMEOUT_S", 2, raising=False)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="did not finish within 2 s"):
        load_inventory(str(work / "lab.ini"))
    assert time.monotonic() - t0 < 30
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


TIMEOUT, LIMIT = 15, 512 << 20


@pytest.mark.slow
def test_a_yaml_alias_bomb_ends_within_the_time_and_memory_limits(tmp_path):
    """A 600-byte YAML bomb ran ansible-inventory to its timeout at 2.35 GB: now it ends within its time limit and
    never above its memory limit, the reason said (measured in a child process, the limits lowered there to keep
    the test short: the peak of that process's children is ansible-inventory's)."""
    bomb = ["all:", "  vars:", '    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        bomb.append(f"    {name}: &{name} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]")
    bomb += ["  hosts:", "    s: {zcorch_pair: p, zcorch_role: sender, zcorch_data_address: 10.0.0.1}"]
    (tmp_path / "bomb.yaml").write_text("\n".join(bomb) + "\n")
    code = textwrap.dedent(f"""
        import resource, sys, time
        from zcorch.config import ansible_inventory
        from zcorch.config.inventory import load_inventory
        from zcorch.errors import ConfigError
        ansible_inventory.TIMEOUT_S, ansible_inventory.MEMORY_LIMIT = {TIMEOUT}, {LIMIT}
        t0 = time.monotonic()
        try:
            load_inventory({str(tmp_path / 'bomb.yaml')!r})
            print("loaded")
        except ConfigError as exc:
            print("refused", exc)
        print(time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": REPO})
    *what, last = res.stdout.splitlines()
    wall, peak = float(last.split()[0]), int(last.split()[1])
    assert peak <= LIMIT, (peak, res.stdout, res.stderr)
    assert wall < TIMEOUT + 10, (wall, res.stdout)
    assert what and what[0].startswith("refused"), res.stdout + res.stderr


def _pair_hostvars() -> dict:
    return {"s": {"zcorch_pair": "p", "zcorch_role": "sender", "zcorch_data_address": "10.0.0.1"},
            "r": {"zcorch_pair": "p", "zcorch_role": "receiver", "zcorch_data_address": "10.0.0.2"}}


def test_a_deeply_nested_json_inventory_is_refused_not_a_traceback(tmp_path):
    depth = 200_000
    text = '{"_meta": {"hostvars": {"s": {"x": ' + "[" * depth + "]" * depth + "}}}, \"all\": {}}"
    (tmp_path / "deep.json").write_text(text)
    with pytest.raises(ConfigError, match="nested more than"):
        load_inventory(str(tmp_path / "deep.json"))


def test_a_json_inventory_over_the_size_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(ansible_inventory, "JSON_MAX_BYTES", 1 << 16, raising=False)
    doc = {"_meta": {"hostvars": {**_pair_hostvars(), "pad": {"x": "y" * (1 << 17)}}}, "all": {}}
    (tmp_path / "big.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="larger than"):
        load_inventory(str(tmp_path / "big.json"))


def test_a_chain_of_5000_groups_reads_without_recursion(tmp_path):
    n = 5000
    doc = {"_meta": {"hostvars": _pair_hostvars()}, "all": {"children": ["g0"]}}
    for i in range(n):
        doc[f"g{i}"] = {"children": [f"g{i + 1}"]} if i < n - 1 else {"hosts": ["s", "r"]}
        doc[f"g{i}"]["vars"] = {"zcorch_workdir": f"/w/{i}"}
    (tmp_path / "chain.json").write_text(json.dumps(doc))
    inv = load_inventory(str(tmp_path / "chain.json"))
    assert inv.pairs["p"].sender.workdir == f"/w/{n - 1}"           # the innermost group's value wins


def test_groups_nested_each_in_all_earlier_ones_read_in_linear_time(tmp_path):
    n = 25       # took over 100 s (the depth of each group recomputed along every path)
    doc = {"_meta": {"hostvars": _pair_hostvars()}, "all": {"children": ["g0"]}}
    for i in range(n):
        doc[f"g{i}"] = {"children": [f"g{j}" for j in range(i + 1, n)]}
    doc[f"g{n - 1}"]["hosts"] = ["s", "r"]
    (tmp_path / "nest.json").write_text(json.dumps(doc))
    t0 = time.monotonic()
    assert "p" in load_inventory(str(tmp_path / "nest.json")).pairs
    assert time.monotonic() - t0 < 5


def test_a_cycle_of_groups_is_refused(tmp_path):
    doc = {"_meta": {"hostvars": _pair_hostvars()}, "all": {"children": ["a"]}, "a": {"children": ["b"]},
           "b": {"children": ["a"], "hosts": ["s", "r"]}}
    (tmp_path / "cycle.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="among its own children"):
        load_inventory(str(tmp_path / "cycle.json"))
