"""Shared fixtures. Area-specific fixtures live in tests/fixtures_<area>.py modules, registered here as
plugins so that pytest knows each fixture once (a session fixture imported into several test modules
would be set up once per module); test modules import only their plain helper functions from them."""
import ast
import functools
import inspect
import os
import re
import shutil
import signal

import pytest

try:    # pytest 9.2+: a node's id is a NodeId in item._id (see _group)
    from _pytest.nodeid import NodeId
except ImportError:
    NodeId = None

pytest_plugins = ["fixtures_analysis", "fixtures_browser", "fixtures_fs", "fixtures_lab", "fixtures_run",
                  "fixtures_spec", "fixtures_worker"]

IS_ROOT = os.geteuid() == 0

# The tier markers a test gets from the fixtures it uses (directly or through other fixtures), so that a
# new test is classified without anyone remembering a decorator. --quick leaves out every test carrying
# one of QUICK_EXCLUDES: those tiers, and `slow`: marked by hand, the end-to-end tests of more than
# QUICK_TEST_S (a localhost sweep through the CLI, a fleet, a report) and those whose size is what they check
# (a 1 GiB transfer, the shipped quick start); derived, every test sharing a module fixture (recorded sweeps,
# a built wheel). The whole suite runs them; a --quick run lists the tests it kept that took longer.
FIXTURE_MARKERS = {
    "lab": ("lab", "root"),        # network namespaces + sshd
    "other_user": ("root",),       # creates a user
    "browser": ("browser",),       # headless Chromium
}
QUICK_EXCLUDES = ("lab", "root", "browser", "slow")
QUICK_TEST_S = 1.5
# `serial` tests run alone (scripts/test runs them in a second pass, on one process, after the parallel one):
# - a test that measures time or CPU (MEASURES; a peak RSS alone, RSS_ONLY, is not: load does not change it),
#   a lab test that measures an elapsed time (ELAPSED), or a test that measures one in a module that
#   measures (its speed checks: "in linear time"; a timeout bound elsewhere holds on a loaded machine);
# - a test that compares machine-wide state (loop devices, the whole mount table, md arrays: MACHINE_STATE): a
#   parallel test's loop device or mount would be a leftover to it; a localhost sweep that holds a lease every
#   other localhost sweep needs (`filesystems:`, or `networks:` outside a namespace of its own, in the test's
#   text or in an experiment file it names: _holds_localhost);
#   (all in the test's own text, _own_text: a module that measures in one test holds 30 that do not; a test
#   marked `deadlines` says its elapsed times are only printed or bounded by a deadline of many seconds)
# - a test using a fixture whose sweeps' throughput it judges (SERIAL_FIXTURES).
# Any other lab test runs in parallel too: each pytest process (each xdist worker) has its own lab
# (tests/fixtures_lab.py: its own name, index, netns, sshd and homes).
MEASURES = re.compile(r"perf_counter|process_time|getrusage|cpu_times|ru_utime|ru_stime|timeit")
RSS_ONLY = re.compile(r"getrusage\([^()]*\)\.ru_maxrss")
ELAPSED = re.compile(r"monotonic\(\)\s*-\s*\w")
MACHINE_STATE = re.compile(r"\bhost_state\(|losetup\W+-J|\b_loops\(|findmnt\W+-rn\W*\]")
# A sweep that provisions `filesystems:` on localhost holds that host's filesystem lease (~/.cache/zcorch/fs)
# and the machine's loop devices: a second one on another worker is refused, as the product should. One that
# changes localhost's network (`networks:`) holds its namespace's network lease, which every other localhost
# sweep needs too, unless it runs in a network namespace of its own (`ip netns exec`: that namespace's lease).
# Root alone is not a reason: CI runs every test as root. A lab test's hosts have their own homes and netns.
LOCAL_FILESYSTEMS = re.compile(r"filesystems:")
LOCAL_NETWORK = re.compile(r"networks:")
OWN_NETNS = re.compile(r"""["']netns["'],\s*["']exec["']""")
SWEEP = re.compile(r"""["']run["']|\brun_sweep\(""")
SERIAL_FIXTURES = {"throttled_nights"}


@functools.lru_cache(maxsize=None)
def _module_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


@functools.lru_cache(maxsize=None)
def _definitions(path: str) -> dict:
    """Each function of a module by its first line (a decorator's, or its `def`'s) -> its source: one parse a
    module instead of inspect.getsource's tokenizing per test, which was half of collecting the suite."""
    text = _module_text(path)
    lines = text.splitlines(keepends=True)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            starts = [node.lineno, *(d.lineno for d in node.decorator_list)]
            source = "".join(lines[min(starts) - 1:node.end_lineno])
            found.update(dict.fromkeys(starts, source))
    return found


def _source(obj) -> str:
    code = getattr(inspect.unwrap(obj), "__code__", None) if callable(obj) else None
    return _definitions(code.co_filename).get(code.co_firstlineno, "") if code else ""


def _own_text(item) -> str:
    """The test function's source, with the module's helper functions it names and the fixtures of its own
    module it uses (a `before` fixture that snapshots the machine, a helper that compares)."""
    function = getattr(item, "function", None)
    text = _source(function)
    module = getattr(item, "module", None)
    for name in set(re.findall(r"\b_?[a-z]\w*", text)) & set(vars(module) if module else ()):
        helper = getattr(module, name)
        if inspect.isfunction(helper) and helper.__module__ == module.__name__ and helper is not function:
            text += _source(helper)
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        for d in defs:
            if getattr(d.func, "__module__", None) == getattr(module, "__name__", ""):
                text += _source(d.func)
    return text


def _measures(text: str) -> bool:
    return bool(MEASURES.search(RSS_ONLY.sub("", text)))


def _is_serial(item) -> bool:
    if SERIAL_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    own = _own_text(item)
    lab = item.get_closest_marker("lab")
    timed = ELAPSED.search(own) and (lab or _measures(_module_text(str(item.path)))) \
        and item.get_closest_marker("deadlines") is None
    return bool(_measures(own) or timed or MACHINE_STATE.search(own) or not lab and _holds_localhost(item, own))


def _holds_localhost(item, own: str) -> bool:
    """Whether the test's sweep on localhost holds a lease every other localhost sweep needs (see above)."""
    if not SWEEP.search(own):
        return False
    # a named study's `networks:` is left out: the tests run studies with `network=null`
    return bool(LOCAL_FILESYSTEMS.search(own + _named_experiments(item, own))
                or LOCAL_NETWORK.search(own) and not OWN_NETNS.search(own))


def _named_experiments(item, own: str) -> str:
    """The text of the experiment files (a shipped study) the test names through its module's constants."""
    module = getattr(item, "module", None)
    out = ""
    for name in set(re.findall(r"\b[A-Z][A-Z0-9_]*\b", own)) & set(vars(module) if module else ()):
        value = getattr(module, name)
        if isinstance(value, (str, os.PathLike)) and str(value).endswith((".yaml", ".yml")):
            out += _module_text(str(value))
    return out


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)


def _group(config, item, name: str) -> None:
    """Mark `item` for xdist's --dist loadgroup, which sends a group to one worker by the "@NAME" suffix of its
    id. xdist 3.8 writes that suffix to item._nodeid, which pytest 9 no longer reads (its id is item._id), so
    the groups were ignored: the suffix is written here where pytest reads it."""
    item.add_marker(pytest.mark.xdist_group(name))
    if getattr(config.option, "loadgroup", False) and "@" not in item.nodeid and NodeId is not None \
            and isinstance(getattr(item, "_id", None), NodeId):
        item._id = NodeId.parse(f"{item.nodeid}@{name}")


def pytest_configure(config):
    # A job a non-interactive shell starts in the background (`.ci/run &`) inherits SIGINT ignored, and an
    # interpreter that starts with it ignored never raises KeyboardInterrupt, nor do the processes it starts:
    # the tests of Ctrl-C expect Python's own handling, as in a terminal.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help="leave out the lab, root and browser tiers (markers derived from fixtures) and the "
                          f"`slow` tests (marked: end-to-end tests of more than {QUICK_TEST_S} s, or whose "
                          "size is their claim)")
    parser.addoption("--serial-tests", choices=("all", "skip", "only"), default="all",
                     help="skip: leave out the `serial` tests (scripts/test's parallel pass); only: run only them")


@pytest.hookimpl(tryfirst=True)   # before xdist's, which reads the groups set here into the node ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            for name in FIXTURE_MARKERS.get(fixture, ()):
                if item.get_closest_marker(name) is None:
                    item.add_marker(name)
        if item.get_closest_marker("lab") and item.get_closest_marker("root") is None:
            item.add_marker("root")
        if _uses_module_fixture(item) and item.get_closest_marker("slow") is None:
            item.add_marker("slow")   # its module's recorded sweeps or built wheel: seconds before any test
        if item.get_closest_marker("serial") is None and _is_serial(item):
            item.add_marker("serial")
        if item.get_closest_marker("serial"):
            _group(config, item, "serial")
        elif "browser" in getattr(item, "fixturenames", ()):
            _group(config, item, "browser")   # one Chromium for the run, not one a worker
        elif _uses_module_fixture(item):
            # a module fixture (a built wheel, recorded sweeps) is set up once, on one worker
            _group(config, item, item.nodeid.split("::")[0])
    serial = config.getoption("serial_tests")
    kept, left = [], []
    for item in items:
        out = (config.getoption("quick") and any(item.get_closest_marker(m) for m in QUICK_EXCLUDES)
               or serial == "skip" and item.get_closest_marker("serial")
               or serial == "only" and not item.get_closest_marker("serial"))
        (left if out else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
    if getattr(config.option, "loadgroup", False):
        # xdist hands out the groups first, then single tests in this order: the long tiers (labs, end-to-end
        # sweeps) first, so that the pass does not end on one process still running one started last
        items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in QUICK_EXCLUDES))
    skip_root = pytest.mark.skip(reason="needs root (network namespaces, loop devices, mounts)")
    for item in items:
        if not IS_ROOT and item.get_closest_marker("root"):
            item.add_marker(skip_root)


_quick_durations: dict = {}


def pytest_runtest_logreport(report):
    # on the controller too under xdist: the workers' reports arrive here with their durations
    if report.when in ("setup", "call"):
        _quick_durations[report.nodeid] = _quick_durations.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, config):
    if not config.getoption("quick") or hasattr(config, "workerinput"):
        return
    long = sorted(((d, n) for n, d in _quick_durations.items() if d > QUICK_TEST_S), reverse=True)
    if long:
        terminalreporter.write_sep("-", f"{len(long)} quick-tier tests over {QUICK_TEST_S} s: mark them slow?")
        for d, n in long:
            terminalreporter.write_line(f"{d:6.2f}s {n}")


def require_tool(name: str) -> str:
    """Path of an executable the test needs, or a skip that names it and the package to install."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (scripts/install-system-deps installs it)")
    return path


def can_drop_caches() -> bool:
    """Whether this process can drop the page cache (what makes a dd read-back uncached): root, and a
    writable /proc/sys (a container's root often has it read-only)."""
    return os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)
