"""Commands import only what they use: `zcorch --help`, `zcorch plan` and `zcorch worker info` never load
pandas, scipy, matplotlib or pyarrow (each costs a second of start-up), and neither does the help of the
commands that do use them (commands that start at once).

Measured on the real interpreter with `-X importtime`, which lists every module the process imported."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "experiments", "quickstart.yaml")
HEAVY = ("pandas", "scipy", "matplotlib", "pyarrow", "numpy", "jinja2", "duckdb")


def imported(argv: "list[str]") -> "tuple[set, subprocess.CompletedProcess]":
    env = {k: v for k, v in os.environ.items() if k != "_ARGCOMPLETE"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "zcorch", *argv], capture_output=True,
                          text=True, env=env, timeout=120)
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert names, proc.stderr[-2000:]  # -X importtime printed its table: the check below means something
    return names, proc


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["plan", QUICKSTART],
    ["plan", "--json", QUICKSTART],
    ["worker", "info"],
    ["compare", "--help"],
    ["history", "--help"],
    ["report", "--help"],
    ["run", "--help"],
], ids=lambda argv: " ".join(os.path.basename(a) for a in argv))
def test_command_imports_nothing_heavy(argv):
    names, proc = imported(argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    heavy = sorted(name for name in names if name.split(".")[0] in HEAVY)
    assert not heavy, f"zcorch {' '.join(argv)} imported {heavy[:8]}"


def test_the_check_sees_a_heavy_import():
    # The same measurement on a command that must load pandas: proves the check above can fail.
    names, proc = imported(["compare", "/nonexistent-a", "/nonexistent-b"])
    assert proc.returncode == 2
    assert "pandas" in names


def test_help_lists_every_command_without_importing_them():
    from zcorch import cli

    names, proc = imported(["--help"])
    for name, module, text in cli.COMMANDS:
        assert name in proc.stdout
        assert text.split()[0] in proc.stdout
        if module != "zcorch.cli.completion":  # main asks it whether the shell is completing (argparse only)
            assert module not in names, f"{module} imported by zcorch --help"


def test_chosen_command_skips_top_level_options():
    from zcorch.cli import chosen_command

    assert chosen_command(["-v", "-q", "plan", "x.yaml"]) == "plan"
    assert chosen_command(["--help"]) == ""
    assert chosen_command(["nosuch", "plan"]) == ""
    assert chosen_command(["--", "plan"]) == ""


def test_the_ssh_layer_leaves_invoke_unimported_until_a_match_exec_is_allowed(tmp_path):
    """paramiko imports invoke only to run an ssh config's `Match exec` (60-130 ms of every `zcorch run`): the
    ssh layer hides it, and hands it to paramiko when --allow-ssh-config-exec lets such a config be read
    (tests/test_safety_net.py runs one)."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host box\n  HostName 127.0.0.1\n")
    code = ("import sys; from zcorch.hosts import ssh; from zcorch.config.hosts import HostSpec; "
            "import paramiko.config as pc; before = 'invoke' in sys.modules; "
            f"ssh.resolve_target(HostSpec(ssh='box', data_address='10.1.2.3', ssh_config={str(cfg)!r})); "
            "plain = 'invoke' in sys.modules; "
            f"ssh.resolve_target(HostSpec(ssh='box', data_address='10.1.2.3', ssh_config={str(cfg)!r}), allow_exec=True); "
            "print(before, plain, 'invoke' in sys.modules, pc.invoke is not None)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "False", "True", "True"]
