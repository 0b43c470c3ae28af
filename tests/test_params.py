"""The parameter and metric tables (zcorch.params) against everything derived from them: the experiment
schema, the worker's argparse and native binding, the runner's flags, the built C core and the docs."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from fixtures_worker import REPO, needs_native, run_pair, worker_env

from zcorch import params as table
from zcorch.config.experiment import PARAM_PARSERS, parse_experiment
from zcorch.errors import ConfigError, ZcorchError
from zcorch.params import (DEFAULTS, METRIC_KEYS, METRICS, PARAM_KEYS, PARAMS, SIZE_KEYS, format_value,
                           metric_applies, param, side_params, side_value, worker_flags)
from zcorch.provision import deploy
from zcorch.worker import cli as worker_cli
from zcorch.worker import native

DOC = os.path.join(REPO, "docs", "experiment-files.md")
REGENERATE = "python -m zcorch.params --update-docs docs/experiment-files.md"

# Every parameter set away from its default (and valid together for the worker).
# (`bytes` and `duration` both set: the spec takes it, the plan's cell rules refuse it: tests/test_plan.py.)
CELL = {"send_mode": "sendfile", "recv_mode": "splice", "bytes": 3 * 2**20 + 5, "duration": 2.5, "buffer": 65536,
        "send_buffer": 8192, "recv_buffer": 32768,
        "window": 1 << 20, "subblocks": 3, "pipe_size": 1 << 18, "send_cpu": 0, "recv_cpu": 1, "gift": True,
        "mmap_grain": "subblock", "splice_grain": "whole", "refill": True, "fill": "rand_crc32", "fsync": True,
        "source": "/srv/in file",
        "sink": "/mnt/a dir/$(rm -rf)", "timeout": 12.5,
        "filesystem": "ext4-loop", "sink_state": "overwrite", "streams": 2, "threads": 2, "send_cpus": "0,1",
        "recv_cpus": "1", "uring_depth": 16, "tcp_maxseg": 4108, "sample_interval": 0.25, "idle_probe": 0.05,
        "network": "jumbo"}


def _yaml_value(key, value) -> str:
    """A value as written in an experiment file (unset = null; paths quoted: they may hold spaces)."""
    if value is None:
        return "null"
    text = format_value(key, value)
    return json.dumps(text) if param(key).kind == "path" else text


# ---------------------------------------------------------------- the tables themselves

def test_every_param_is_complete_and_consistent():
    assert len(set(PARAM_KEYS)) == len(PARAMS) and tuple(DEFAULTS) == PARAM_KEYS
    assert set(CELL) == set(PARAM_KEYS), "give a new parameter a non-default value in CELL (tests/test_params.py)"
    assert SIZE_KEYS == {"bytes", "buffer", "send_buffer", "recv_buffer", "window", "pipe_size"}
    for p in PARAMS:
        assert p.kind in table.KINDS and p.side in table.SIDES, p
        assert p.help and "\n" not in p.help and not p.help.endswith("."), p.key
        assert (p.flag is None) == (p.side == "controller"), f"{p.key}: a worker flag iff a worker side"
        assert p.flag is None or (p.flag.startswith("--") and p.dest.isidentifier())
        assert p.unset in (None, "auto", "null") and (p.default is not None or p.unset), p.key
        assert p.worker_absent in ("default", "required", "none")
        if p.kind == "choice":
            assert p.choices and p.noun and (p.default in p.choices)
        if p.kind in ("int", "cpu"):
            assert p.min is not None
    for side in ("send", "recv"):
        flags = [p.flag for p in side_params(side)]
        assert len(flags) == len(set(flags)), f"{side}: one flag for two parameters"
    with pytest.raises(AttributeError):
        PARAMS[0].default = "mmap"  # the table is immutable
    with pytest.raises(ZcorchError, match="unknown parameter 'bufer'.*buffer"):
        param("bufer")
    with pytest.raises(ZcorchError, match="send or recv"):
        side_params("both")


def test_every_metric_is_complete_and_names_a_real_capability():
    assert len(set(METRIC_KEYS)) == len(METRICS)
    for m in METRICS:
        assert m.side in ("send", "recv", "both") and m.unit and m.help and "\n" not in m.help, m
        if m.applies_to is not None:
            assert m.applies_to in native.capability_names(), m.name


def test_the_runner_worker_and_analysis_take_their_names_from_the_tables():
    from zcorch.analysis import frames, plots
    from zcorch.config import experiment
    from zcorch.sweep import runner

    assert experiment.DEFAULTS is DEFAULTS and experiment.PARAM_KEYS is PARAM_KEYS
    assert set(PARAM_PARSERS) == set(PARAM_KEYS)
    assert frames.PARAM_KEYS is PARAM_KEYS and frames.METRIC_KEYS is METRIC_KEYS is native.METRIC_KEYS
    assert plots.format_value is experiment.format_value is format_value and runner.worker_flags is worker_flags
    assert list(native.SINK_STATES) == list(param("sink_state").choices)


# ---------------------------------------------------------------- the experiment schema

def test_defaults_and_every_written_value_pass_the_spec_and_come_back_equal():
    for values in (DEFAULTS, CELL):
        text = "name: t\nparams:\n" + "".join(f"  {k}: {_yaml_value(k, v)}\n" for k, v in values.items())
        if values["filesystem"]:
            text += "filesystems:\n  ext4-loop: {fs: ext4, loop: {size: 1GiB}}\n"
        if values["network"]:
            text += "allow_network_changes: true\nnetworks:\n  jumbo: {mtu: 9000}\n"
        assert parse_experiment(text).base_params() == values


def test_constraints_of_the_table_are_what_the_spec_enforces():
    def problem(key, written):
        with pytest.raises(ConfigError) as ei:
            parse_experiment(f"name: t\nparams: {{{key}: {written}}}\n")
        return str(ei.value)

    assert f"buffer: expected a size between 1 and {table.BUFFER_MAX} bytes (1GiB), got {2**31}" in problem("buffer", "2GiB")
    assert parse_experiment("name: t\nparams: {bytes: 4GiB}\n").params["bytes"] == 4 * 2**30  # no limit
    assert f"between 0 and {table.CPU_MAX}" in problem("recv_cpu", table.CPU_MAX + 1)
    assert "expected an integer between 1 and" in problem("subblocks", 0)
    assert "is not a sink state; did you mean `overwrite`?" in problem("sink_state", "overwrit")
    assert "expected `mem`, an absolute path (e.g. /dev/zero) or {scratch}/FILE" in problem("source", "in.bin")
    assert "{filesystem} is not allowed in the source" in problem("source", '"{filesystem}/x"')
    assert "expected an absolute path (or {scratch}/FILE or {filesystem}/FILE)" in problem("sink", "out")
    # `auto` is the word of the kernel-default sizes only; a CPU is unset with null
    assert parse_experiment("name: t\nparams: {window: auto, pipe_size: null}\n").params == \
        {"window": None, "pipe_size": None}
    assert "expected an integer" in problem("send_cpu", "auto")


def test_format_value_writes_what_users_write_and_reads_analysis_frames():
    assert [format_value(k, DEFAULTS[k]) for k in ("bytes", "buffer", "window", "send_cpu", "gift", "timeout")] \
        == ["1GiB", "128KiB", "auto", "none", "false", "1m"]
    assert format_value("timeout", 90.0) == "90s" and format_value("timeout", 0.5) == "0.5s"
    assert format_value("bytes", 1000) == "1000" and format_value("bytes", 3 * 2**20 + 5) == str(3 * 2**20 + 5)
    # what pandas holds: NaN for missing, numpy scalars, sizes as floats when a column has a NaN
    assert format_value("window", float("nan")) == "auto" and format_value("filesystem", math.nan) == "none"
    assert format_value("buffer", np.int64(65536)) == "64KiB" and format_value("buffer", 65536.0) == "64KiB"
    assert format_value("send_cpu", 1.0) == "1" and format_value("gift", np.bool_(True)) == "true"
    assert format_value("buffer", "auto") == "auto"
    assert format_value("sweep", "run-1") == "run-1" and format_value("sweep", None) == "none"  # not a parameter


# ---------------------------------------------------------------- the worker

@pytest.mark.parametrize("side", ["send", "recv"])
def test_every_flag_of_the_table_is_accepted_by_the_worker_and_no_other_sides(side):
    address = ["--connect", "127.0.0.1:9"] if side == "send" else ["--listen", "127.0.0.1:0"]
    parser = worker_cli.build_parser()
    mine = side_params(side)
    for p in mine:  # each flag alone, written as a user writes the value
        value = [] if p.kind == "bool" else [_yaml_value(p.key, CELL[p.key]).strip('"')]
        mode = [] if p.flag == "--mode" else ["--mode", "x"]
        args = parser.parse_args([side, *address, *mode, p.flag, *value])
        got = getattr(args, p.dest)
        assert got is not None and got is not False, p.key
    for p in PARAMS:
        if p.flag is not None and p.flag not in {q.flag for q in mine}:
            with pytest.raises(worker_cli._UsageError, match="unrecognized arguments"):
                parser.parse_args([side, *address, "--mode", "x", p.flag, *([] if p.kind == "bool" else ["1"])])
    # a flag the worker cannot do without is required; the others take the table's default
    with pytest.raises(worker_cli._UsageError, match="--mode"):
        parser.parse_args([side, *address])
    applied = native.normalize_params(side, **worker_cli._params(parser.parse_args([side, *address, "--mode", "x"])))
    for p in mine:
        if p.worker_absent == "default":
            assert applied[p.dest] == p.default, p.key
        elif p.worker_absent == "none":
            assert applied[p.dest] is None, p.key


@pytest.mark.parametrize("side", ["send", "recv"])
@pytest.mark.parametrize("cell", [CELL, DEFAULTS, dict(CELL, timeout=1e7, window="auto")], ids=["set", "defaults", "big"])
def test_worker_flags_round_trip_through_the_worker_parser(side, cell):
    address = ["--connect", "127.0.0.1:9"] if side == "send" else ["--listen", "127.0.0.1:0"]
    argv = [side, *address, *worker_flags(side, cell)]
    args = worker_cli.build_parser().parse_args(argv)
    applied = native.normalize_params(side, **worker_cli._params(args))
    assert args.mode == cell[f"{side}_mode"]
    for p in side_params(side):
        if p.dest != "mode":
            value = side_value(side, cell, p.key)  # the side's own buffer (send_buffer / recv_buffer) when set
            want = None if value == "auto" else value
            assert applied[p.dest] == want, (p.key, argv)
    if cell is CELL:  # each side really gets its own size
        assert applied["buffer"] == {"send": 8192, "recv": 32768}[side]


def test_per_side_parameters_replace_the_shared_one_for_their_side_only():
    replacers = [p for p in PARAMS if p.replaces]
    assert {(p.key, p.side, p.replaces) for p in replacers} == {("send_buffer", "send", "buffer"),
                                                                ("recv_buffer", "recv", "buffer")}
    for p in replacers:  # same flag and kind as the shared one; never a flag of its own
        shared = param(p.replaces)
        assert p.flag == shared.flag and p.kind == shared.kind and shared.side == "both" and p.default is None
        assert p not in side_params(p.side) and p.id_omit_default
    cell = dict(DEFAULTS, buffer=65536, send_buffer=8192)
    assert side_value("send", cell, "buffer") == 8192 and side_value("recv", cell, "buffer") == 65536
    assert side_value("send", dict(cell, send_buffer=float("nan")), "buffer") == 65536  # a frame's missing cell
    assert worker_flags("send", cell).count("--buffer") == 1
    assert format_value("send_buffer", None) == "(buffer)" and format_value("recv_buffer", 8192) == "8KiB"


def test_worker_flags_pin_the_runner_command_line():
    assert worker_flags("send", CELL) == [
        "--mode", "sendfile", "--bytes", "3145733", "--duration", "2.5", "--buffer", "8192", "--window", "1048576", "--subblocks", "3",
        "--pipe-size", "262144", "--cpu", "0", "--mmap-grain", "subblock", "--splice-grain", "whole",
        "--fill", "rand_crc32", "--source",
        "/srv/in file", "--timeout", "12.5", "--streams", "2", "--threads", "2", "--cpus", "0,1",
        "--uring-depth", "16", "--sample-interval", "0.25", "--idle-probe", "0.05", "--gift", "--refill"]
    assert worker_flags("recv", DEFAULTS) == [
        "--mode", "read", "--bytes", "1073741824", "--buffer", "131072", "--subblocks", "1", "--sink", "/dev/null",
        "--timeout", "60", "--sink-state", "fresh", "--streams", "1", "--uring-depth", "8", "--sample-interval", "1"]
    assert "--sample-interval" not in worker_flags("send", dict(DEFAULTS, sample_interval=None))  # null: no samples


def test_the_worker_imports_the_table_cheaply_and_everything_it_imports_is_deployed():
    code = ("import sys, zcorch.worker.cli; "
            "print(sorted(m for m in sys.modules if m.startswith('zcorch'))); "
            "print(sorted(m for m in ('typing', 'dataclasses', 'inspect') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO, env=worker_env(), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    modules, slow = p.stdout.splitlines()
    # each costs the worker's start-up 5-15 ms (the table is namedtuples for this reason)
    assert slow == "[]", f"a module the worker imports imports {slow} at run time"
    deployed = set(deploy.worker_sources())
    for name in eval(modules):
        if name != "zcorch._native":
            rel = name.replace(".", "/")
            assert f"{rel}.py" in deployed or f"{rel}/__init__.py" in deployed, name
    assert "zcorch.params" in eval(modules)


# ---------------------------------------------------------------- the built C core

@needs_native
def test_mode_choices_are_the_modes_the_native_module_registers():
    compiled = native.compiled_modes()
    assert list(param("send_mode").choices) == compiled["send"]
    assert list(param("recv_mode").choices) == compiled["recv"]
    assert {name: getattr(native.lib, f"ZC_SINK_STATE_{name.upper()}") for name in param("sink_state").choices} \
        == native.SINK_STATES


@needs_native
def test_metric_table_is_the_c_struct_and_says_where_each_metric_is_null(tmp_path):
    struct = {name for name, _ in native.ffi.typeof("zc_metrics").fields}
    assert struct
    # every metric is a zc_metrics field, or a host_* metric the worker derives from its /proc snapshots
    host = {m for m in METRIC_KEYS if m.startswith("host_")}
    assert struct | host == set(METRIC_KEYS) and not struct & host
    for send_mode, recv_mode, fsync in (("msg_zerocopy", "splice", True), ("vmsplice", "read", False),
                                        ("write", "mmap", True)):
        sink = str(tmp_path / f"{send_mode}-{recv_mode}")
        results = run_pair(send_mode, recv_mode, send_kw=dict(source="mem", bytes=2**20),
                           recv_kw=dict(sink=sink, fsync=fsync))
        for result in results:
            # the receiver also notes the data connections it dropped (`refused`, counted in refused_connections)
            assert set(result) == set(METRIC_KEYS) | {"side", "mode", "params", "samples"} | (
                {"refused"} if result["side"] == "recv" else set())
            for m in METRICS:
                caps = native.mode_capabilities()[result["side"]][result["mode"]]
                # fsync_ns needs fsync, host_idle_before the idle probe (none here: tests/test_claim_conditions.py)
                expect = (metric_applies(m, result["side"], caps) and (m.name != "fsync_ns" or fsync)
                          and m.name != "host_idle_before")
                assert (result[m.name] is not None) == expect, (m.name, result["side"], result["mode"])


# ---------------------------------------------------------------- the docs

def test_docs_tables_are_generated_from_the_tables():
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    assert table.render_docs(text) == text, \
        f"docs/experiment-files.md differs from the tables in zcorch/params.py; regenerate it: {REGENERATE}"
    for p in PARAMS:
        assert f"| `{p.key}` | " in text
    for m in METRICS:
        assert f"| `{m.name}` | " in text


def test_update_docs_rewrites_only_the_generated_blocks(tmp_path):
    doc = tmp_path / "doc.md"
    begin, end = table.doc_markers("params")
    mbegin, mend = table.doc_markers("metrics")
    doc.write_text(f"# Title\n\nprose\n{begin}\n| stale |\n{end}\nmore prose\n{mbegin}\n{mend}\n")
    cmd = [sys.executable, "-m", "zcorch.params", "--update-docs", str(doc)]
    p = subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    text = doc.read_text()
    assert text.startswith("# Title\n\nprose\n") and "| stale |" not in text and "\nmore prose\n" in text
    assert table.markdown_tables()["params"] in text and table.markdown_tables()["metrics"] in text
    doc.write_text("no markers\n")
    p = subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "<!-- params:begin -->" in p.stderr and doc.read_text() == "no markers\n"
    p = subprocess.run([sys.executable, "-m", "zcorch.params", "--markdown"], cwd=REPO, env=worker_env(),
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and begin in p.stdout and "| `pipe_size` |" in p.stdout
