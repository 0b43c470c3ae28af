"""The plan and the worker agree on every numeric worker parameter's limits.

For each one, the smallest and the largest value `zcorch plan` accepts is accepted by the worker (the
real C core: zcorch.worker.native.validate runs zc_validate, the checks zc_send_run and zc_recv_listen
start with), and the next value out is refused by both, with the same message. No mocks: the experiment
parser and the built C core themselves.
"""
from __future__ import annotations

import errno

import pytest

from fixtures_analysis import zcorch_cli
from fixtures_worker import needs_native
from zcorch import params as table
from zcorch.config.experiment import parse_experiment
from zcorch.errors import ConfigError, WorkerError
from zcorch.worker import native

# Every numeric parameter a worker gets (a flag): sizes, integers, CPUs, durations.
NUMERIC = [p for p in table.PARAMS if p.kind in table.NUMERIC_KINDS and p.flag is not None]
MODES = {"send": "write", "recv": "read"}


def _sides(p):
    return ("send", "recv") if p.side == "both" else (p.side,)


def _written(p, value) -> str:
    """The value as an experiment file writes it (a duration in seconds, exact)."""
    return f"{value!r}s" if p.kind == "duration" else str(value)


def _just_out(p, value, step):
    """The next value beyond a limit: one more (or less) integer; for a duration, a millisecond more or half the
    least (not 0: the worker's --sample-interval 0 is its spelling of the plan's null, no samples)."""
    if p.kind == "duration":
        return value + 1e-3 if step > 0 else value / 2
    return value + step


def _context(p) -> "dict[str, object]":
    """Other parameters the value needs to be valid at all: subblocks at most buffer."""
    return {"buffer": table.BUFFER_MAX} if p.key == "subblocks" else {}


def _plan(p, value):
    """The value as the plan parses it, or the ConfigError message."""
    extra = "".join(f", {k}: {v}" for k, v in _context(p).items())
    try:
        exp = parse_experiment(f"name: t\nparams: {{{p.key}: {_written(p, value)}{extra}}}\n")
    except ConfigError as exc:
        return None, str(exc)
    return exp.params[p.key], None


def _worker(p, side, value):
    """None if the worker of `side` accepts the value, else its error message."""
    base = {"source": "mem", "bytes": 1} if side == "send" else {}
    try:
        native.validate(side, MODES[side], **{**base, **_context(p), p.dest: value})
    except WorkerError as exc:
        assert exc.code == errno.EINVAL, exc
        return str(exc)
    return None


def test_every_numeric_worker_parameter_has_limits_and_a_c_field_or_a_reason():
    assert {p.key for p in NUMERIC} >= {"bytes", "buffer", "window", "subblocks", "pipe_size", "send_cpu",
                                        "streams", "uring_depth", "tcp_maxseg", "timeout", "sample_interval"}
    for p in NUMERIC:
        assert p.min is not None and p.max is not None and p.min <= p.max, p.key
        assert p.c_unset is None or not p.min <= p.c_unset <= p.max, p.key  # "unset" is never a value
        # a C field, or the replaced parameter's (send_buffer), or none: the watch's interval, the idle probe (Python)
        assert p.ctype is not None or p.replaces or p.key in ("sample_interval", "idle_probe"), p.key
    assert table.limit_problem(table.param("streams"), 300) == "expected an integer between 1 and 256, got 300"


@needs_native
@pytest.mark.parametrize("p", NUMERIC, ids=[p.key for p in NUMERIC])
def test_the_plan_and_the_worker_agree_on_the_limits(p):
    for limit, step in ((p.min, -1), (p.max, +1)):
        got, problem = _plan(p, limit)
        assert problem is None and got == limit, (p.key, limit, problem)
        for side in _sides(p):
            assert _worker(p, side, limit) is None, (p.key, side, limit)
        out = _just_out(p, limit, step)
        want = table.limit_problem(p, out)
        assert want is not None and want.startswith("expected ") and f", got {table.format_got(p, out)}" in want
        got, problem = _plan(p, out)
        assert got is None and f"params.{p.key}: {want}" in problem, (p.key, out, problem)
        for side in _sides(p):
            message = _worker(p, side, out)
            assert message is not None and message.endswith(f"{p.flag}: {want}"), (p.key, side, out, message)


@needs_native
def test_a_run_refuses_what_validation_refuses_with_the_same_message():
    # the transfer path itself (not only zc_validate): refused before it connects anywhere
    want = table.limit_problem(table.param("buffer"), table.BUFFER_MAX + 1)
    with pytest.raises(WorkerError) as ei:
        native.send("127.0.0.1", 9, "write", source="mem", bytes=1, buffer=table.BUFFER_MAX + 1, timeout=5)
    assert str(ei.value) == f"send write: --buffer: {want}"
    with pytest.raises(WorkerError) as ei:
        native.Receiver("127.0.0.1", 0, "read", window=table.WINDOW_MAX + 1).close()
    assert str(ei.value).endswith(f"--window: {table.limit_problem(table.param('window'), table.WINDOW_MAX + 1)}")


@pytest.mark.parametrize("key", ["buffer", "window"])
def test_plan_refuses_a_buffer_the_worker_cannot_take_naming_file_line_and_limit(tmp_path, key):
    # 1536MiB passed `zcorch plan` (the table allowed INT_MAX) and then every run failed in the worker
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: t\nhosts: localhost\nparams:\n  send_mode: write\n  {key}: 1536MiB\n")
    r = zcorch_cli("plan", path)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    limit = "between 1 and 1073741824 bytes (1GiB)" if key == "buffer" else "between 1 and 1073741823 bytes"
    assert f"{path}:5:" in r.stderr and f"params.{key}: expected a size {limit}, got {1536 << 20}" in r.stderr
