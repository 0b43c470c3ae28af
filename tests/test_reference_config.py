"""The `reference:` section of experiment files (zcorch.config.reference): parsing, file:line errors,
and the plan-time check that every match selects exactly one cell."""
from __future__ import annotations

import textwrap

import pytest

from zcorch.config.experiment import parse_experiment
from zcorch.config.reference import Quantity
from zcorch.errors import ConfigError
from zcorch.plan import expand
from zcorch.units import convert, parse_quantity

HEAD = """\
name: t
params: {source: /dev/zero}
matrix:
  send_mode: [write, splice]
  buffer: [64KiB, 8KiB]
"""

GOOD = HEAD + """\
reference:
  source: {title: "A study", author: Jim, date: 2006-11-16, url: "https://lkml.org/", venue: lkml}
  setup: two hosts back to back
  baselines:
    iperf3: {value: 6.9 Gbit/s, command: "iperf -w 1M -l 64K"}
    dd_write: {value: 465-520 MB/s}
  figures:
    - {label: "A", match: {send_mode: write, buffer: 64KiB}, metric: mb_s, value: 857 MB/s}
    - {match: {send_mode: splice, buffer: 65536}, metric: send_stime_us, value: 6.864 s}
  claims:
    - says: splice is faster
      metric: gbit_s
      a: {send_mode: splice, buffer: 64KiB}
      b: {send_mode: write, buffer: {not: 8KiB}}
      holds_if: a >= 2 * b
"""


def parse(text: str):
    return parse_experiment(textwrap.dedent(text), "exp.yaml")


def errors(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        expand(parse(text))
    return str(info.value)


def test_a_reference_is_parsed_and_normalised():
    ref = parse(GOOD).reference
    assert ref.source.title == "A study" and ref.source.date == "2006-11-16"   # a YAML date stays its text
    assert [(b.kind, b.value) for b in ref.baselines] == [("iperf3", Quantity(6.9, 6.9, "Gbit/s")),
                                                          ("dd_write", Quantity(465, 520, "MB/s"))]
    assert ref.baseline("iperf3").command == "iperf -w 1M -l 64K"
    f0, f1 = ref.figures
    assert f0.baseline == "iperf3" and f1.baseline is None      # only throughput is normalised
    assert f1.value.to("µs") == (6864000.0, 6864000.0)
    assert f0.match.selects({"send_mode": "write", "buffer": 65536.0})   # a runs-frame row holds floats
    assert not f0.match.selects({"send_mode": "write", "buffer": 8192})
    (claim,) = ref.claims
    assert (claim.op, claim.factor, claim.condition) == (">=", 2.0, "a >= 2 × b")
    assert claim.b.describe() == "send_mode=write, buffer≠8KiB"
    plan = expand(parse(GOOD))
    assert plan.warnings == []


def test_units_convert_within_a_dimension_only():
    assert parse_quantity("465–520 MB/s") == (465.0, 520.0, "MB/s")
    assert convert(857, "MB/s", "Gbit/s") == pytest.approx(6.856)
    assert convert(1, "MiB/s", "MB/s") == pytest.approx(1.048576)
    with pytest.raises(ValueError, match="cannot convert"):
        convert(1, "s", "MB/s")
    with pytest.raises(ValueError):
        parse_quantity("520-465 MB/s")


@pytest.mark.parametrize("bad, line, needle", [
    ("  sauce: {title: x}\n", 7, "reference.sauce: unknown key `sauce`; did you mean `source`?"),
    ("  source: {title: x, year: 2006}\n", 7, "reference.source.year: unknown key"),
    ("  source: {title: x}\n  baselines: {iperf: {value: 1 Gbit/s}}\n", 8, "did you mean `iperf3`"),
    ("  source: {title: x}\n  baselines: {dd_read: {value: 3 s}}\n", 8, "is not a rate"),
    ("  source: {title: x}\n  figures:\n    - {match: {send_mode: write, buffer: 8KiB}, metric: mbs, value: 1 MB/s}\n",
     9, "reference.figures[0].metric: `mbs` is not a metric; did you mean `mb_s`?"),
    ("  source: {title: x}\n  figures:\n    - {match: {send_mode: write, buffer: 8KiB}, metric: mb_s, value: 857}\n",
     9, "`857` has no unit"),
    ("  source: {title: x}\n  figures:\n    - {match: {send_mode: write, buffer: 8KiB}, metric: mb_s, value: 3 s}\n",
     9, "does not fit metric `mb_s`"),
    ("  source: {title: x}\n  figures:\n    - {match: {sendmode: write}, metric: mb_s, value: 1 MB/s}\n",
     9, "reference.figures[0].match.sendmode: unknown parameter `sendmode`; did you mean `send_mode`?"),
    ("  source: {title: x}\n  figures:\n    - {match: {buffer: 12XB}, metric: mb_s, value: 1 MB/s}\n",
     9, "reference.figures[0].match.buffer: not a size"),
    ("  source: {title: x}\n  claims:\n    - {says: x, metric: mb_s, a: {send_mode: write}, b: {send_mode: splice},"
     " holds_if: a more than b}\n", 9, "holds_if: `a more than b` is not a condition"),
    ("  source: {title: x}\n  claims:\n    - {says: x, metric: mb_s, a: {send_mode: write}}\n", 9,
     "reference.claims[0]: missing `holds_if:`, `b:`"),
    ("  title: x\n", 7, "missing `source:`"),
])
def test_mistakes_are_reported_at_file_line(bad, line, needle):
    with pytest.raises(ConfigError) as info:
        parse(HEAD + "reference:\n" + bad)
    msg = str(info.value)
    assert needle in msg, msg
    assert f"exp.yaml:{line}:" in msg, msg


def test_matches_must_select_exactly_one_cell_of_the_file():
    text = HEAD + """\
reference:
  source: {title: x}
  figures:
    - {match: {send_mode: splice}, metric: mb_s, value: 1 MB/s}
  claims:
    - {says: x, metric: mb_s, a: {send_mode: mmap}, b: {send_mode: write, buffer: 8KiB}, holds_if: a > b}
"""
    msg = errors(text)
    assert "exp.yaml:9:" in msg and "reference.figures[0]: send_mode=splice selects 2 cells; one is needed: " \
                                   "add `buffer` to tell them apart" in msg
    assert "exp.yaml:11:" in msg and "reference.claims[0].a: send_mode=mmap selects no cell" in msg


def test_a_run_reduced_with_set_only_warns():
    text = HEAD + """\
reference:
  source: {title: x}
  figures:
    - {match: {send_mode: write, buffer: 8KiB}, metric: mb_s, value: 1 MB/s}
"""
    exp = parse_experiment(text, "exp.yaml", overrides=["buffer=64KiB"])
    plan = expand(exp)
    assert any("reference.figures[0]" in w and "not measured" in w for w in plan.warnings)
    assert exp.reference == parse(text).reference     # the effective document keeps the section


def test_a_command_reference_keeps_the_experiment_s_name():
    # the check of `reference.baselines.command:NAME` against `baselines.commands` once reused the
    # experiment's `name` for the command's: the plan and the results were named after the command
    text = GOOD.replace("dd_write: {value: 465-520 MB/s}", '"command:nc": {value: 502.77 MB/s}') + """\
baselines:
  commands: [{name: nc, receiver: [nc, -l, "{address}", "{port}"], sender: [nc, -N, "{address}", "{port}"]}]
"""
    exp = parse(text)
    assert exp.name == "t" and [c.name for c in exp.baselines.commands] == ["nc"]
    assert expand(exp).experiment.name == "t"
    with pytest.raises(ConfigError, match="no command baseline `nc`"):
        parse(text.replace("{name: nc,", "{name: ncat,"))
