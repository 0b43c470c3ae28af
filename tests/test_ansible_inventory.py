"""`--hosts` with an Ansible inventory (zcorch.config.ansible_inventory): its YAML and INI files and the JSON
the real `ansible-inventory --list` prints of them give the same pairs as zcorch's own inventory would; a bad
one is refused naming file:line, the host and the variable; an inventory script is never run."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from zcorch.config.inventory import load_inventory, select
from zcorch.errors import ConfigError

from fixtures_analysis import ROOT, zcorch_cli

pytest.importorskip("ansible", reason="the test extras install ansible-core (zcorch[ansible])")

YAML = """all:
  vars:
    ansible_user: root
    ansible_python_interpreter: /usr/bin/python3
  children:
    rack3:
      vars:
        zcorch_pair: rack3
      hosts:
        r3a: {ansible_host: 10.77.0.2, zcorch_role: sender, zcorch_data_address: 10.78.0.2, zcorch_shares: uplink1}
        r3b: {ansible_host: 10.77.0.3, ansible_port: 2222, zcorch_role: receiver, zcorch_data_address: 10.78.0.3}
    rack4:
      hosts:
        r4a: {zcorch_pair: rack4, zcorch_role: sender, zcorch_data_address: 192.168.4.1,
              ansible_ssh_private_key_file: keys/lab_ed25519}
        r4b: {zcorch_pair: rack4, zcorch_role: receiver, zcorch_data_address: 192.168.4.2,
              zcorch_allow_network_changes: true, zcorch_shares: [uplink1]}
    web:
      hosts:
        www1:
"""
INI = """www1

[rack3]
r3a ansible_host=10.77.0.2 zcorch_role=sender zcorch_data_address=10.78.0.2 zcorch_shares=uplink1
r3b ansible_host=10.77.0.3 ansible_port=2222 zcorch_role=receiver zcorch_data_address=10.78.0.3

[rack3:vars]
zcorch_pair=rack3

[rack4]
r4a zcorch_pair=rack4 zcorch_role=sender zcorch_data_address=192.168.4.1 ansible_ssh_private_key_file=keys/lab_ed25519
r4b zcorch_pair=rack4 zcorch_role=receiver zcorch_data_address=192.168.4.2 zcorch_allow_network_changes=true zcorch_shares="['uplink1']"

[all:vars]
ansible_user=root
ansible_python_interpreter=/usr/bin/python3
"""
# the same two pairs in zcorch's own inventory format: what every Ansible form must give
OWN = """pairs:
  rack3:
    sender: {ssh: root@10.77.0.2, data_address: 10.78.0.2, python: /usr/bin/python3}
    receiver: {ssh: "root@10.77.0.3:2222", data_address: 10.78.0.3, python: /usr/bin/python3}
    shares: uplink1
  rack4:
    sender: {ssh: r4a, data_address: 192.168.4.1, python: /usr/bin/python3, identity_file: keys/lab_ed25519}
    receiver: {ssh: root@r4b, data_address: 192.168.4.2, python: /usr/bin/python3, allow_network_changes: true}
    shares: [uplink1]
"""


def ansible_list(source) -> str:
    """The real `ansible-inventory -i SOURCE --list` output."""
    exe = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
    exe = exe if os.access(exe, os.X_OK) else shutil.which("ansible-inventory")
    res = subprocess.run([exe, "-i", str(source), "--list"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def pairs_of(path):
    """The pairs and what each shares with other pairs (fleet runs never overlap those)."""
    inv = load_inventory(str(path))
    return dict(inv.pairs), dict(inv.shares)


@pytest.mark.slow
def test_yaml_ini_and_their_ansible_inventory_json_give_the_same_pairs(tmp_path):
    (tmp_path / "inv.yaml").write_text(YAML)
    (tmp_path / "inv.ini").write_text(INI)
    (tmp_path / "yaml.json").write_text(ansible_list(tmp_path / "inv.yaml"))
    (tmp_path / "ini.json").write_text(ansible_list(tmp_path / "inv.ini"))
    own = OWN.replace("ssh: r4a,", "ssh: root@r4a,")
    (tmp_path / "own.yaml").write_text(own)
    expected = pairs_of(tmp_path / "own.yaml")
    for name in ("inv.yaml", "inv.ini", "yaml.json", "ini.json"):
        assert pairs_of(tmp_path / name) == expected, name
    pair = select(f"{tmp_path / 'inv.ini'}:rack4")
    assert pair.hosts.sender.identity_file == str(tmp_path / "keys" / "lab_ed25519")   # relative to the inventory
    assert pair.record() == {"path": str(tmp_path / "inv.ini"), "sha256": pair.sha256, "pair": "rack4"}
    assert load_inventory(str(tmp_path / "inv.yaml")).pairs.keys() == {"rack3", "rack4"}   # www1: no zcorch_pair

    res = zcorch_cli("plan", ROOT / "experiments" / "quickstart.yaml", "--hosts", f"{tmp_path / 'yaml.json'}:rack3",
                     "--json")
    assert res.returncode == 0, res.stderr


BAD = [
    ("r3b: {ansible_host: 10.77.0.3, ansible_port: 2222, zcorch_role: receiver",
     "r3b: {ansible_host: 10.77.0.3, ansible_port: 2222, zcorch_role: recv",
     [":11: host `r3b`: zcorch_role: expected `sender` or `receiver`, got 'recv'",
      "pair `rack3`: needs exactly one host with zcorch_role: receiver, has none"]),
    ("r4b: {zcorch_pair: rack4, zcorch_role: receiver, zcorch_data_address: 192.168.4.2,",
     "r4b: {zcorch_pair: rack4, zcorch_role: sender,",
     [":16: pair `rack4`: needs exactly one host with zcorch_role: sender, has 2: `r4a`, `r4b`"]),
    ("r3a: {ansible_host: 10.77.0.2,", "r3a: {ansible_host: '-oProxyCommand=touch /tmp/x',",
     [":10: host `r3a` (pair rack3, sender): ansible_host, ansible_user, ansible_port:", "not a valid host name"]),
    ("zcorch_data_address: 10.78.0.2, zcorch_shares", "zcorch_data_address: null, zcorch_shares",
     [":10: host `r3a` (pair rack3, sender):", "`zcorch_data_address`"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("old,new,expected", BAD, ids=["role", "two senders", "ssh option", "no data address"])
def test_a_bad_ansible_inventory_names_file_line_host_and_variable(tmp_path, old, new, expected):
    assert old in YAML
    path = tmp_path / "inv.yaml"
    path.write_text(YAML.replace(old, new))
    with pytest.raises(ConfigError) as err:
        load_inventory(str(path))
    text = str(err.value)
    for part in expected:
        assert part in text, text
    assert text.startswith(str(path))
    # the JSON of the same inventory: the same problem, the host named
    js = tmp_path / "inv.json"
    js.write_text(ansible_list(path))
    with pytest.raises(ConfigError) as err:
        load_inventory(str(js))
    assert expected[-1].split(": ", 1)[-1][:40] in str(err.value), str(err.value)


@pytest.mark.slow
def test_no_pair_an_unreadable_file_and_an_inventory_script_that_is_never_run(tmp_path):
    path = tmp_path / "plain.ini"
    path.write_text("[web]\nwww1\nwww2 ansible_host=10.0.0.9\n")
    with pytest.raises(ConfigError, match="no host has the variable `zcorch_pair`"):
        load_inventory(str(path))
    broken = tmp_path / "broken.ini"
    broken.write_text("[web\nwww1 =\n")
    with pytest.raises(ConfigError, match="broken.ini"):
        load_inventory(str(broken))
    marker = tmp_path / "ran"
    script = tmp_path / "cloud.py"
    script.write_text(f"#!/bin/sh\ntouch {marker}\necho '{{\"all\": {{\"hosts\": []}}}}'\n")
    script.chmod(0o755)
    res = zcorch_cli("plan", ROOT / "experiments" / "quickstart.yaml", "--hosts", f"{script}:x")
    assert res.returncode == 2 and "never runs it" in res.stderr and "ansible-inventory -i" in res.stderr, res.stderr
    assert not marker.exists()
    assert json.loads(ansible_list(path))["_meta"]["hostvars"]["www2"]["ansible_host"] == "10.0.0.9"
