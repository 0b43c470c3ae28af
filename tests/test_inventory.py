"""Inventory files (zcorch.config.inventory): parsing, errors at file:line, pair selection, ZCORCH_HOSTS,
relative paths, and the lab's inventory (`zcorch lab inventory`) read back by the same parser."""
from __future__ import annotations

import hashlib
import os
import textwrap

import pytest
import yaml

from fixtures_spec import at
from zcorch.config.experiment import load_experiment
from zcorch.config.hosts import Hosts, HostSpec
from zcorch.config.inventory import ENV_VAR, complete_spec, from_environment, load_inventory, select, split_spec
from zcorch.errors import ConfigError
from zcorch.lab.netns import LabLayout

INVENTORY = """\
pairs:
  lab:
    sender:   {ssh: root@10.77.0.2, data_address: 10.78.0.2}
    receiver: {ssh: root@10.77.0.3, data_address: 10.78.0.3}
  rack3:
    sender:   {ssh: bob@rack3-a:2222, data_address: 192.0.2.1, identity_file: keys/rack3, python: /opt/py/bin/python3}
    receiver: {ssh: bob@rack3-b, data_address: 192.0.2.2, known_hosts: ../shared/known_hosts,
               ssh_config: ~/.ssh/rack3.conf, workdir: /data/zcorch}
  here: localhost
"""


def write(tmp_path, text, name="inventory.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def problems(path):
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.exit_status == 2
    return info.value.problems


def test_pairs_parse_into_the_hosts_of_an_experiment(tmp_path):
    path = write(tmp_path, INVENTORY)
    inv = load_inventory(path)
    assert list(inv.pairs) == ["lab", "rack3", "here"]
    assert inv.sha256 == hashlib.sha256(open(path, "rb").read()).hexdigest() and inv.path == path
    assert inv.pairs["here"] == Hosts()
    lab = inv.pairs["lab"]
    assert lab == Hosts.from_mapping({"sender": {"ssh": "root@10.77.0.2", "data_address": "10.78.0.2"},
                                      "receiver": {"ssh": "root@10.77.0.3", "data_address": "10.78.0.3"}})
    rack3 = inv.pairs["rack3"]
    # relative paths are relative to the inventory's directory (and made absolute); ~/ stays for ssh
    assert rack3.sender == HostSpec(ssh="bob@rack3-a:2222", data_address="192.0.2.1",
                                    identity_file=str(tmp_path / "keys" / "rack3"), python="/opt/py/bin/python3")
    assert rack3.receiver.known_hosts == os.path.join(os.path.dirname(tmp_path), "shared", "known_hosts")
    assert rack3.receiver.ssh_config == "~/.ssh/rack3.conf" and rack3.receiver.workdir == "/data/zcorch"


def test_a_relative_inventory_path_is_resolved_from_where_it_is_read(tmp_path, monkeypatch):
    write(tmp_path, INVENTORY)
    monkeypatch.chdir(tmp_path)
    chosen = select("inventory.yaml:rack3")
    assert chosen.path == str(tmp_path / "inventory.yaml")
    assert chosen.hosts.sender.identity_file == str(tmp_path / "keys" / "rack3")


def test_pair_selection_only_first_named_and_unknown(tmp_path):
    path = write(tmp_path, INVENTORY)
    assert select(path).pair == "lab"  # the first
    chosen = select(f"{path}:rack3")
    assert chosen.pair == "rack3" and chosen.pairs == ("lab", "rack3", "here")
    assert chosen.record() == {"path": path, "sha256": load_inventory(path).sha256, "pair": "rack3"}
    only = write(tmp_path, "pairs:\n  solo: localhost\n", "solo.yaml")
    assert select(only).pair == "solo"
    with pytest.raises(ConfigError) as info:
        select(f"{path}:rack4")
    (msg,) = info.value.problems
    assert msg.startswith(f"--hosts {path}:rack4: ") and "no pair `rack4`" in msg
    assert "did you mean `rack3`?" in msg and "its pairs: lab, rack3, here" in msg
    with pytest.raises(ConfigError, match=r"^ZCORCH_HOSTS .*no pair `x`"):
        select(f"{path}:x", ENV_VAR)


def test_a_file_whose_name_has_a_colon_is_a_file(tmp_path):
    path = write(tmp_path, INVENTORY, "inv:lab.yaml")
    assert split_spec(path) == (path, None)
    assert split_spec(f"{path}:here") == (path, "here")
    assert select(f"{path}:here").hosts.localhost
    assert split_spec("a.yaml:") == ("a.yaml", None)


def test_missing_inventory_names_the_flag(tmp_path):
    with pytest.raises(ConfigError) as info:
        select(str(tmp_path / "nope.yaml") + ":lab")
    (msg,) = info.value.problems
    assert msg.startswith("--hosts ") and "cannot read the inventory file" in msg
    with pytest.raises(ConfigError, match="empty value"):
        select("")


def test_errors_name_inventory_file_line_and_key_all_at_once(tmp_path):
    path = write(tmp_path, """\
        pairs:
          lab:
            sender: {ssh: -oProxyCommand=x, data_address: 10.78.0.2}
            receiver: {ssh: root@h, data_adress: 10.78.0.3}
          "bad name": localhost
          x: inventory
          y:
          z: {sender: {ssh: h, data_address: 10.0.0.1, identity_file: ~bob/key}, receiver: {ssh: h, data_address: 1.2.3}}
        paris: 1
        """)
    found = problems(path)
    assert at(found[0], path, 3, 19) and "pairs.lab.sender.ssh: " in found[0] and "-oProxyCommand=x" in found[0]
    expect = [(4, "pairs.lab.receiver: missing required key `data_address`"),
              (4, "pairs.lab.receiver.data_adress: unknown key `data_adress`; did you mean `data_address`?"),
              (5, "pairs.bad name: `bad name` is not a valid pair name"),
              (6, "pairs.x: expected `localhost` or a mapping"),
              (7, "pairs.y: expected `localhost` or a mapping with `sender:` and `receiver:`, got nothing"),
              (8, "pairs.z.sender.identity_file: `~bob/key`: write ~/..."),
              (8, "pairs.z.receiver.data_address: `1.2.3` is not a valid host name or IP address"),
              (9, "paris: unknown key `paris`; did you mean `pairs`?")]
    for (line, text), problem in zip(expect, found[1:]):
        assert at(problem, path, line) and text in problem, (line, text, problem)
    assert len(found) == 1 + len(expect)


@pytest.mark.parametrize("text, message", [
    ("", "the file is empty; an inventory needs `pairs:`"),
    ("pairs: {}\n", "pairs: no pair defined"),
    ("pairs: [lab]\n", "pairs: expected a mapping of pair names to hosts, got a list"),
    ("- lab\n", "expected a mapping with `pairs:`, got a list"),
    ("hosts: localhost\n", "pairs: missing required key `pairs`"),
    ("pairs: {a: localhost}\n---\npairs: {}\n", "more than one YAML document (`---`); an inventory file holds"),
    ("pairs: {a: localhost, a: localhost}\n", "duplicate key `a`"),
])
def test_malformed_inventories(tmp_path, text, message):
    path = write(tmp_path, text)
    assert any(message in p and p.startswith(f"{path}:") for p in problems(path)), problems(path)


def test_the_flag_wins_over_the_environment(tmp_path):
    path = write(tmp_path, INVENTORY)
    assert from_environment(None, {}) is None and from_environment(None, {ENV_VAR: ""}) is None
    assert from_environment(None, {ENV_VAR: f"{path}:rack3"}).pair == "rack3"
    # the env is not even read when the flag is given (a broken env value does not matter)
    assert from_environment(f"{path}:here", {ENV_VAR: "/no/such/file:x"}).pair == "here"
    with pytest.raises(ConfigError, match="^ZCORCH_HOSTS /no/such"):
        from_environment(None, {ENV_VAR: "/no/such/file:x"})


def test_experiment_files_keep_requiring_absolute_paths(write_yaml):
    """An experiment file is copied into each result set: a relative key path there is refused, with why."""
    path = write_yaml("name: t\nhosts:\n  sender: {ssh: a, data_address: 10.0.0.1, identity_file: keys/id}\n"
                      "  receiver: {ssh: b, data_address: 10.0.0.2}\n")
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    (msg,) = info.value.problems
    assert "hosts.sender.identity_file" in msg and "in an inventory file (--hosts), paths are relative" in msg


# -- the lab's inventory --------------------------------------------------------------------------

def test_lab_inventory_reads_back_as_the_lab_hosts(tmp_path):
    """What `zcorch lab inventory` prints is an inventory whose one pair (named after the lab) is the
    lab's hosts, and what `zcorch lab up` prints is the same hosts as an experiment's `hosts:` block."""
    layout = LabLayout("ci-runner_7", 17)
    path = write(tmp_path, layout.inventory_yaml())
    chosen = select(path)
    assert chosen.pair == "ci-runner_7" and chosen.pairs == ("ci-runner_7",)
    assert chosen.hosts == layout.hosts()
    assert yaml.safe_load(layout.inventory_yaml()) == layout.inventory_spec() == {
        "pairs": {"ci-runner_7": layout.hosts_spec()}}
    assert yaml.safe_load(layout.hosts_yaml()) == {"hosts": layout.hosts_spec()}
    # one function writes both: the role lines are the same text, indented differently
    role_lines = [line.strip() for line in layout.hosts_yaml().splitlines()[1:]]
    assert role_lines == [line.strip() for line in layout.inventory_yaml().splitlines()[2:]]


FLEET = """\
pairs:
  a: {sender: {ssh: root@10.77.1.2, data_address: 10.78.1.2}, receiver: {ssh: root@10.77.1.3, data_address: 10.78.1.3},
      shares: tor1}
  b: {sender: {ssh: root@10.77.2.2, data_address: 10.78.2.2}, receiver: {ssh: root@10.77.2.3, data_address: 10.78.2.3},
      shares: [tor1, uplink]}
  c: localhost
"""


def test_shares_are_part_of_the_pair_and_not_of_its_hosts(tmp_path):
    path = write(tmp_path, FLEET)
    inv = load_inventory(path)
    assert inv.shares == {"a": ("tor1",), "b": ("tor1", "uplink")}
    assert inv.pair("b").shares == ("tor1", "uplink") and inv.pair("c").shares == ()
    assert inv.pairs["a"].sender.ssh == "root@10.77.1.2"   # `shares` did not reach the hosts parser
    assert "shares" not in inv.pair("a").record()           # the manifest's inventory record is unchanged


def test_fleet_selection_in_the_order_given_all_in_file_order(tmp_path):
    from zcorch.config.inventory import is_fleet_spec, select_pairs

    path = write(tmp_path, FLEET)
    assert is_fleet_spec(f"{path}:a,b") and is_fleet_spec(f"{path}:all")
    assert not is_fleet_spec(f"{path}:a") and not is_fleet_spec(path) and not is_fleet_spec(None)
    _, pairs = select_pairs(f"{path}:b,a")
    assert [p.pair for p in pairs] == ["b", "a"]
    inv, pairs = select_pairs(f"{path}:all")
    assert [p.pair for p in pairs] == ["a", "b", "c"] and inv.path == path
    with pytest.raises(ConfigError) as info:
        select_pairs(f"{path}:a,x,a,")
    assert "an empty pair name" in info.value.problems[0]
    with pytest.raises(ConfigError) as info:
        select_pairs(f"{path}:a,x,a")
    assert any("pair `a` is named twice" in p for p in info.value.problems)
    assert any("no pair `x`" in p for p in info.value.problems)
    with pytest.raises(ConfigError, match="by `zcorch run` only"):
        select(f"{path}:a,b")


@pytest.mark.parametrize("text, message", [
    ("pairs:\n  all: localhost\n", "2:3: pairs.all: `all` is reserved"),
    ("pairs:\n  a: {sender: {ssh: h, data_address: 10.0.0.1}, receiver: {ssh: i, data_address: 10.0.0.2},"
     " shares: [ok, 'bad name']}\n", "2:106: pairs.a.shares: `bad name` is not a valid name"),
    ("pairs:\n  a: {sender: {ssh: h, data_address: 10.0.0.1}, receiver: {ssh: i, data_address: 10.0.0.2},"
     " shares: {x: 1}}\n", "pairs.a.shares: expected a name or a list of names"),
    ("pairs:\n  a: {sender: {ssh: h, data_address: 10.0.0.1}, receiver: {ssh: i, data_address: 10.0.0.2},"
     " share: x}\n", "pairs.a.share: unknown key `share`"),
])
def test_bad_shares_name_file_line_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    found = problems(path)
    assert any(message in p for p in found), found


def test_completion_after_file_colon_offers_the_pair_names(tmp_path):
    path = write(tmp_path, INVENTORY)
    assert complete_spec(path + ":") == [f"{path}:{n}" for n in ("lab", "rack3", "here", "all")]
    assert complete_spec(path + ":r") == [f"{path}:rack3"]
    # a fleet being typed: the pairs not named yet, and no `all` after a comma
    assert complete_spec(path + ":lab,") == [f"{path}:lab,rack3", f"{path}:lab,here"]
    assert complete_spec(path + ":lab,h") == [f"{path}:lab,here"]
    # the file name itself is the shell's to complete; a file that is not an inventory offers nothing
    assert complete_spec(path) == []
    assert complete_spec(str(tmp_path / "missing.yaml") + ":") == []
    broken = write(tmp_path, "pairs: [1, 2]\n", "broken.yaml")
    assert complete_spec(broken + ":") == []
