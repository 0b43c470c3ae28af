"""The command line's habits, tried as a user would: -V, -q, tab completion in a real bash, the shipped
examples, and a closed pipe (`zcorch run ... | head`, `2>&1 | head`) that must never reach the sweep."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from fixtures_analysis import ROOT, zcorch_cli

TINY = """name: tiny-pipe
hosts: localhost
params: {bytes: 4MiB, source: mem, timeout: 30s}
matrix:
  send_mode: [write, vmsplice]
  recv_mode: [read]
repeats: 2
baselines: false
"""


def test_version_and_help_read_for_users():
    from zcorch import __version__

    for flag in ("-V", "--version"):
        res = zcorch_cli(flag)
        assert res.returncode == 0 and res.stdout.strip() == f"zcorch {__version__}"
    res = zcorch_cli("--help")
    commands = [ln.split()[0] for ln in res.stdout.split("commands:")[1].split("start here:")[0].splitlines()
                if ln.startswith("    ") and not ln.startswith("     ")]
    assert commands[:2] == ["plan", "run"] and commands[-1] == "worker"      # the internal command last
    assert "zcorch examples copy quickstart" in res.stdout and "exit status:" in res.stdout


@pytest.mark.slow
@pytest.mark.parametrize("closed", ["stdout", "both"])
def test_a_closed_pipe_ends_output_quietly_and_leaves_the_sweep_alone(tmp_path, closed):
    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY)
    out = tmp_path / "set"
    # a real pipe whose reader is gone before the first byte: every write to it is EPIPE
    r, w = os.pipe()
    os.close(r)
    res = subprocess.run([sys.executable, "-m", "zcorch", "run", str(exp), "-o", str(out)], cwd=ROOT,
                         stdout=w, stderr=w if closed == "both" else subprocess.PIPE, timeout=300)
    os.close(w)
    assert res.returncode == 0, res.stderr
    if closed == "stdout":
        assert b"Traceback" not in res.stderr and b"BrokenPipe" not in res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    runs = [json.loads(ln) for ln in (out / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 4 and all(r["status"] == "ok" for r in runs)


@pytest.mark.slow
def test_quiet_prints_no_progress_and_progress_names_modes(tmp_path):
    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY)
    loud = zcorch_cli("run", exp, "-o", tmp_path / "loud")
    assert loud.returncode == 0, loud.stderr
    assert "set-up took" in loud.stderr and "copy-cost calibration" in loud.stderr
    assert "write→read r0: ok" in loud.stderr and "Gbit/s" in loud.stderr and "vmsplice→read r1" in loud.stderr
    quiet = zcorch_cli("-q", "run", exp, "-o", tmp_path / "quiet")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert "results:" in quiet.stdout                       # the answer is still printed


@pytest.mark.slow
def test_tab_completion_in_a_real_bash(tmp_path):
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("pairs:\n  here: localhost\n  rack3: localhost\n")
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not installed")
    code = zcorch_cli("completion", "bash")
    assert code.returncode == 0 and "complete" in code.stdout
    # the completion function the shell code registers, called as bash calls it on <TAB>
    zcorch = f"{sys.executable} -m zcorch"
    script = f"""
zcorch() {{ {zcorch} "$@"; }}
export -f zcorch
{code.stdout}
complete -p zcorch >/dev/null || exit 3
fn=$(complete -p zcorch | sed -E 's/.*-F ([^ ]+) .*/\\1/')
for line in "zcorch ru" "zcorch compare a b --met" "zcorch examples co" "zcorch examples copy q" "zcorch history r --metric gbit_s_" "zcorch run x.yaml --hosts {inventory}:" "zcorch plan x.yaml --hosts {inventory}:here," "zcorch examples copy n"; do
  COMP_LINE="$line"; COMP_POINT=${{#COMP_LINE}}; read -ra COMP_WORDS <<< "$line"; COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
  COMPREPLY=(); $fn zcorch "${{COMP_WORDS[-1]}}" "${{COMP_WORDS[-2]}}" 2>/dev/null
  echo "${{COMPREPLY[*]}}"
done
"""
    res = subprocess.run([bash, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and len(lines) == 8, res.stdout + res.stderr
    assert "run" in lines[0].split()
    assert "--metric" in lines[1].split()
    assert "copy" in lines[2].split()
    assert lines[3].split() == ["quickstart"]                                  # example names, not file names
    assert "gbit_s_vs_control" in lines[4].split()                           # metric names
    # pair names after `--hosts FILE:` (bash splits words at ':', so only what follows it is offered)
    assert sorted(lines[5].split()) == ["all", "here", "rack3"]
    assert lines[6].split() == ["here,rack3"]
    assert lines[7].split() == ["nightly"]                                     # the recipe is an example too


def test_a_commands_errors_show_its_own_usage_and_its_help_whole_sentences():
    # an unknown option after a command: that command's usage, exit 2 (not the top level's)
    for argv, usage in ((("run", "x.yaml", "--bogus"), "usage: zcorch run "),
                        (("examples", "copy", "quickstart", "--zz"), "usage: zcorch examples copy "),
                        (("compare", "a", "b", "--bogus"), "usage: zcorch compare ")):
        res = zcorch_cli(*argv)
        assert res.returncode == 2 and res.stderr.startswith(usage), res.stderr
        assert "unrecognized arguments: " + argv[-1] in res.stderr
    # each command's description is its docstring's first paragraph: it ends a sentence
    from zcorch.cli import COMMANDS

    for name, _module, _text in COMMANDS:
        if name == "worker":
            continue
        out = zcorch_cli(name, "--help").stdout
        description = " ".join(out.split("\n\n")[1].split())
        assert description.endswith((".", ")", "?")), (name, description)


@pytest.mark.slow
def test_examples_list_and_copy_never_overwrite(tmp_path):
    res = zcorch_cli("examples")
    names = [ln.split()[0] for ln in res.stdout.splitlines() if ln and not ln.startswith("copy")]
    assert res.returncode == 0 and names[0] == "quickstart" and "analysis" in names and "schutt-2006" in names
    res = zcorch_cli("examples", "copy", "quickstart", tmp_path / "mine")
    assert res.returncode == 0, res.stderr
    written = tmp_path / "mine" / "quickstart.yaml"
    assert written.read_text() == (ROOT / "experiments" / "quickstart.yaml").read_text()
    again = zcorch_cli("examples", "copy", "quickstart", tmp_path / "mine")
    assert again.returncode == 2 and "not overwritten" in again.stderr   # an input error, as the README's table says
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "analysis.ipynb").symlink_to(victim)
    linked = zcorch_cli("examples", "copy", "analysis", tmp_path / "linked")
    assert linked.returncode == 2 and victim.read_text() == "keep"
    unknown = zcorch_cli("examples", "copy", "nope", tmp_path)
    assert unknown.returncode == 2 and "quickstart" in unknown.stderr
    # a recipe is a directory, copied as one and never into one that exists (a link to one included)
    assert "nightly" in names
    res = zcorch_cli("examples", "copy", "nightly", tmp_path / "ops")
    assert res.returncode == 0, res.stderr
    recipe = ROOT / "contrib" / "nightly"
    assert sorted(p.name for p in (tmp_path / "ops" / "nightly").iterdir()) == sorted(p.name for p in recipe.iterdir())
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "linked" / "nightly").symlink_to(tmp_path / "elsewhere")
    linked = zcorch_cli("examples", "copy", "nightly", tmp_path / "linked")
    assert linked.returncode == 2 and "not overwritten" in linked.stderr and not list((tmp_path / "elsewhere").iterdir())


@pytest.mark.slow
def test_run_json_of_the_quick_start_validates_against_the_documented_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "docs" / "schemas" / "run-events.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    # the quick start itself, smaller: its baselines (iperf3, dd, when installed) and every mode pair
    res = zcorch_cli("run", ROOT / "experiments" / "quickstart.yaml", "-o", tmp_path / "qs", "--json",
                     "--set", "duration=50ms", "--set", "repeats=1", "--set", "baselines.iperf3.duration=1s")
    lines = res.stdout.splitlines()
    events = [json.loads(ln) for ln in lines]        # stdout holds nothing but JSON, one object a line
    for ev in events:
        errors = sorted(validator.iter_errors(ev), key=str)
        assert not errors, (ev["event"], [e.message for e in errors])
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-2:] == ["summary", "end"]
    runs = [e for e in events if e["event"] == "run"]
    assert len(runs) == events[0]["runs"] and [r["done"] for r in runs] == list(range(1, len(runs) + 1))
    assert all((r["gbit_s"] or 0) > 0 for r in runs if r["status"] == "ok")
    end = events[-1]
    assert end["exit_status"] == res.returncode and end["result_dir"] == str(tmp_path / "qs")
    recorded = [json.loads(ln) for ln in (tmp_path / "qs" / "baselines.jsonl").read_text().splitlines()]
    assert [e["record"] for e in events if e["event"] == "baseline"] == recorded   # each, as it was written
    if shutil.which("iperf3"):
        assert any(r["kind"] == "iperf3" for r in recorded)
    assert len(events[-2]["cells"]) == len({r["cell"] for r in runs})
    # the stages came in the pipeline's order, before the runs
    from zcorch.sweep.pipeline import STAGES
    order = [name for name, _ in STAGES]
    seen = [e["stage"] for e in events if e["event"] == "stage"]
    assert seen == sorted(seen, key=order.index) and kinds.index("run") > kinds.index("stage")
