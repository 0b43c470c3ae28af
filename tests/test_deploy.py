"""zcorch.provision.deploy: real uploads and remote cffi builds in the lab hosts, preflight on real hosts."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

from zcorch._version import __version__
from zcorch.config.hosts import DEFAULT_WORKDIR, Hosts, HostSpec
from zcorch.hosts.interpreter import python_argv
from zcorch.provision import deploy
from zcorch.config.baselines.kind import Tool
from zcorch.errors import DeployError, PreflightError
from zcorch.hosts.local import LocalHost

PACKAGE_PARENT = deploy.PACKAGE_PARENT


def _copy_sources(dest) -> str:
    """A private copy of the deployed files, laid out as on a host, so a test can change them."""
    for rel, path in deploy.worker_sources().items():
        os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(path, os.path.join(dest, rel))
    return str(dest)


# -- pure / local ----------------------------------------------------------------------------
def test_host_python_and_workdir_come_from_the_typed_spec():
    local = LocalHost()
    assert deploy.host_python(local) == sys.executable and deploy.host_workdir(local) == DEFAULT_WORKDIR
    local.spec = HostSpec(ssh="localhost", data_address="127.0.0.1", python="/opt/py", workdir="/srv/zc")
    assert deploy.host_workdir(local) == "/srv/zc"
    assert deploy.host_python(local) == sys.executable  # a local worker is always this interpreter


def test_deployed_files_and_hash(tmp_path):
    files = deploy.worker_sources()
    for must in ("zcorch/__init__.py", "zcorch/_version.py", "zcorch/errors.py", "zcorch/units.py",
                 "zcorch/worker/native.py", "zcorch/worker/cli.py", "zcorch/worker/__main__.py",
                 "zcorch/worker/remote.py", "native/build.py", "native/include/zcorch_api.h",
                 "native/modes/send_write.c"):
        assert must in files
    assert any(f.endswith(".c") for f in files) and any(f.endswith(".h") for f in files)
    assert not any(f.startswith("zcorch/analysis") or f == "zcorch/ssh.py" for f in files)
    src = _copy_sources(tmp_path / "src")
    assert list(deploy.worker_sources(src)) == list(files)   # the same paths on the host
    h1 = deploy.content_hash(deploy.worker_sources(src))
    assert h1 == deploy.content_hash(deploy.worker_sources()) and len(h1) == 16
    with open(os.path.join(src, "zcorch/units.py"), "a") as f:
        f.write("\n# changed\n")
    assert deploy.content_hash(deploy.worker_sources(src)) != h1
    os.rename(os.path.join(src, "native/modes/send_write.c"), os.path.join(src, "native/modes/send_write.c.off"))
    assert "native/modes/send_write.c" not in deploy.worker_sources(src)     # a mode file removed: not uploaded
    os.unlink(os.path.join(src, "zcorch/worker/__main__.py"))
    with pytest.raises(DeployError, match="zcorch/worker/__main__.py"):
        deploy.worker_sources(src)


def test_the_c_sources_come_from_the_package_data_when_the_install_has_it(tmp_path, monkeypatch):
    """A checkout or editable install: native/ next to the package; a wheel: zcorch/_native_src/ (setup.py)."""
    assert deploy.native_sources_dir() == os.path.join(PACKAGE_PARENT, "native")
    checkout = deploy.worker_sources()
    assert checkout["native/build.py"] == os.path.join(PACKAGE_PARENT, "native", "build.py")
    assert checkout["zcorch/worker/cli.py"] == os.path.join(PACKAGE_PARENT, "zcorch", "worker", "cli.py")
    # The package as a wheel installs it (no native/ beside it): found through importlib.resources.
    site = tmp_path / "site-packages"
    shutil.copytree(os.path.join(PACKAGE_PARENT, "zcorch"), site / "zcorch",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copytree(os.path.join(PACKAGE_PARENT, "native"), site / "zcorch" / deploy.NATIVE_PACKAGE_DATA,
                    ignore=shutil.ignore_patterns("_build", "__pycache__"))
    code = ("import json, zcorch; from zcorch.provision import deploy; "
            "print(json.dumps([zcorch.__file__, deploy.native_sources_dir(), deploy.worker_sources(), "
            "deploy.content_hash(deploy.worker_sources())]))")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(site)})
    assert p.returncode == 0, p.stderr
    init, native_dir, installed, digest = json.loads(p.stdout)
    assert init == str(site / "zcorch" / "__init__.py")
    assert native_dir == str(site / "zcorch" / deploy.NATIVE_PACKAGE_DATA)
    assert list(installed) == list(checkout)
    assert all(path.startswith(str(site) + os.sep) for path in installed.values())
    assert installed["native/modes/send_write.c"] == str(site / "zcorch" / "_native_src" / "modes" / "send_write.c")
    assert digest == deploy.content_hash(checkout)       # the same build directory on a host
    # Neither there: the error says what is missing and how to get it.
    shutil.rmtree(site / "zcorch" / deploy.NATIVE_PACKAGE_DATA)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(site)})
    assert p.returncode == 1 and "DeployError: worker sources missing under" in p.stderr
    assert "native/build.py" in p.stderr and "reinstall zcorch" in p.stderr


def test_localhost_deploy_is_the_package_itself():
    host = LocalHost()
    handle = deploy.deploy(host)
    # -S (no site, no .pth files): _cffi_backend's directory is on PYTHONPATH instead.
    import _cffi_backend

    assert handle.worker_argv == python_argv(sys.executable, "zcorch.worker", ["-S"], sys.version_info >= (3, 11))
    assert handle.env == {"PYTHONPATH": f"{PACKAGE_PARENT}:{os.path.dirname(_cffi_backend.__file__)}"} and handle.reused
    r = host.run(handle.command(["info"]))
    assert r.ok, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["version"] == __version__
    handles = deploy.prepare({"sender": host, "receiver": host})
    assert handles["sender"].worker_argv == handle.worker_argv


def test_reused_build_in_a_shared_workdir_is_refused(tmp_path):
    """A marked build is reused as is and goes onto PYTHONPATH: only if no other user can change it."""
    host = LocalHost("receiver", "127.0.0.1")
    host.is_local = False                                               # this machine as a remote host
    host.spec = HostSpec(ssh="127.0.0.1", data_address="127.0.0.1", python=sys.executable)
    host.expand = os.path.expanduser                                    # SSHHost.expand's job, done here
    wd = tmp_path / "wd"
    build = wd / f"worker-{deploy.content_hash(deploy.worker_sources())}"
    build.mkdir(parents=True)
    (build / deploy.MARKER).write_text("{}")
    wd.chmod(0o777)
    with pytest.raises(DeployError, match=f"refusing to use the worker build in {build}: .*chmod go-w {wd}"):
        deploy.deploy(host, workdir=str(wd))
    wd.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(build, 65534, 65534)
        with pytest.raises(DeployError, match=f"{build} is owned by uid 65534, not by uid 0 .* chown"):
            deploy.deploy(host, workdir=str(wd))
        os.chown(build, 0, 0)
    assert deploy.deploy(host, workdir=str(wd)).reused


def test_a_reused_build_with_a_tampered_nested_file_is_refused(tmp_path):
    """Not only the top directory is checked: a module two levels down that another user can rewrite
    (or owns, or a symlink planted there) would run on PYTHONPATH all the same."""
    host = LocalHost("receiver", "127.0.0.1")
    host.is_local = False                                               # this machine as a remote host
    host.spec = HostSpec(ssh="127.0.0.1", data_address="127.0.0.1", python=sys.executable)
    host.expand = os.path.expanduser
    wd = tmp_path / "wd"
    build = wd / f"worker-{deploy.content_hash(deploy.worker_sources())}"
    nested = build / "zcorch" / "worker" / "cli.py"
    nested.parent.mkdir(parents=True)
    nested.write_text("# the build's module\n")
    (build / deploy.MARKER).write_text("{}")
    for d in (wd, build, build / "zcorch", nested.parent):
        d.chmod(0o755)
    nested.chmod(0o644)
    assert deploy.deploy(host, workdir=str(wd)).reused                  # a clean build is reused
    nested.chmod(0o666)
    with pytest.raises(DeployError, match=f"refusing to use the worker build in {build}: .*{nested} is writable by "
                                          "group or others .*delete"):
        deploy.deploy(host, workdir=str(wd))
    nested.chmod(0o644)
    (build / "zcorch").chmod(0o775)
    with pytest.raises(DeployError, match=f"{build / 'zcorch'} is writable by group or others"):
        deploy.deploy(host, workdir=str(wd))
    (build / "zcorch").chmod(0o755)
    if os.geteuid() == 0:
        os.chown(nested, 65534, 65534)
        with pytest.raises(DeployError, match=f"{nested} is owned by uid 65534"):
            deploy.deploy(host, workdir=str(wd))
        os.chown(nested, 0, 0)
    (build / "zcorch" / "json.py").symlink_to(tmp_path / "elsewhere.py")
    with pytest.raises(DeployError, match="json.py is a symlink"):
        deploy.deploy(host, workdir=str(wd))
    (build / "zcorch" / "json.py").unlink()
    assert deploy.deploy(host, workdir=str(wd)).reused
    # above the workdir: a directory anyone may write (no sticky bit) lets them swap the workdir itself
    tmp_path.chmod(0o777)
    try:
        with pytest.raises(DeployError, match=f"{tmp_path} \\(above the workdir\\) is writable by group or others "
                                              "without the sticky bit"):
            deploy.deploy(host, workdir=str(wd))
        tmp_path.chmod(0o1777)
        assert deploy.deploy(host, workdir=str(wd)).reused
    finally:
        tmp_path.chmod(0o700)


def test_a_probed_build_state_saves_the_deploy_its_own_commands(tmp_path):
    """prepare() hands the preflight probe the workdir and the build's name; deploy() given that answer runs
    nothing for a reused build (not even `~`'s lookup), and refuses one the probe refused with the message it
    gives without the probe."""
    host = LocalHost("receiver", "127.0.0.1")
    host.is_local = False                                               # this machine as a remote host
    host.spec = HostSpec(ssh="127.0.0.1", data_address="127.0.0.1", python=sys.executable)
    host.expand = os.path.expanduser
    wd = tmp_path / "wd"
    _, build = deploy.build_directory(host, deploy.content_hash(deploy.worker_sources()), str(wd))
    os.makedirs(os.path.join(build, "zcorch"), mode=0o755)
    os.chmod(wd, 0o755)
    with open(os.path.join(build, deploy.MARKER), "w") as f:
        f.write(json.dumps({"cffi_backend_dir": "/opt/cffi"}))
    ran = []
    real_run = host.run
    host.run = lambda argv, **kw: ran.append(argv) or real_run(argv, **kw)   # a spy: every command still runs
    host.expand = lambda path: ran.append(["expand", path]) or os.path.expanduser(path)
    name = os.path.basename(build)
    probed = deploy.probe_host(host, build=(str(wd), name))["build"]
    assert probed == {"workdir": str(wd), "path": build, "marker": json.dumps({"cffi_backend_dir": "/opt/cffi"}),
                      "refused": None}
    ran.clear()
    handle = deploy.deploy(host, workdir=str(wd), probed=probed)
    assert handle.reused and ran == [] and handle.python_flags == ["-S"]
    assert handle.env["PYTHONPATH"] == f"{build}:/opt/cffi"
    os.chmod(os.path.join(build, "zcorch"), 0o777)
    refused = deploy.probe_host(host, build=(str(wd), name))["build"]
    with pytest.raises(DeployError) as probed_error:
        deploy.deploy(host, workdir=str(wd), probed=refused)
    with pytest.raises(DeployError) as own_error:
        deploy.deploy(host, workdir=str(wd))                            # no probe: cat + private-build
    assert str(probed_error.value) == str(own_error.value)
    assert f"refusing to use the worker build in {build}: " in str(own_error.value)
    os.chmod(os.path.join(build, "zcorch"), 0o755)
    other = dict(refused, path=build + "-other")                        # an answer about another directory
    assert deploy.deploy(host, workdir=str(wd), probed=other).reused    # is not taken: checked here


def test_host_problems_messages_from_captured_probe():
    host = LocalHost("receiver", "127.0.0.1")
    # a probe result as printed by a Debian host without cffi, headers, gcc, iperf3 (captured shape)
    facts = {"python": [3, 11, 2], "executable": "/usr/bin/python3", "cffi": None, "python_h": False, "cc": None,
             "tools": {"iperf3": None, "qperf": None}, "address_error": None,
             "busy_ports": [[5201, "[Errno 98] Address already in use"]]}
    probs = deploy.host_problems(host, facts, tools=[Tool("iperf3", "iperf3"), Tool("qperf", "qperf")])
    assert probs == ["receiver: iperf3 not found — apt-get install iperf3",
                     "receiver: qperf not found — apt-get install qperf",
                     "receiver: port 5201 on 127.0.0.1 is in use ([Errno 98] Address already in use) — stop what "
                     "listens there or choose another port"]
    host.is_local = False  # the same facts on a remote host: the build tools matter there
    probs = deploy.host_problems(host, facts)
    assert any("apt-get install python3-cffi" in p for p in probs)
    assert any("apt-get install python3-dev" in p for p in probs)
    assert any("apt-get install gcc" in p for p in probs)
    assert not any("iperf3" in p for p in probs)


# -- lab ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hosts(lab):
    from zcorch.hosts import ssh

    opened = ssh.open_hosts(lab.hosts)
    yield opened
    for h in opened.values():
        h.close()


@pytest.mark.lab
@pytest.mark.deadlines   # the redeploy is timed against the first deploy of the same test, not a clock
def test_remote_build_redeploy_and_change(hosts, lab, tmp_path):
    receiver = hosts["receiver"]
    src = _copy_sources(tmp_path / "src")
    workdir = f"~/.cache/zcorch-test-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    handle = deploy.deploy(receiver, source_root=src, workdir=workdir)
    first = time.monotonic() - t0
    assert not handle.reused
    assert handle.python_flags == ["-S"] and handle.env["PYTHONPATH"].startswith(handle.directory + ":/")
    assert handle.directory == f"/root/{workdir[2:]}/worker-{handle.hash}"
    # the files are in the receiver's private home, not on the controller's filesystem
    assert receiver.run(["test", "-f", f"{handle.directory}/zcorch/worker/cli.py"]).ok
    assert receiver.run(["sh", "-c", f"ls {handle.directory}/zcorch/_native*.so"]).ok
    assert not os.path.exists(handle.directory)
    assert os.path.isdir(os.path.join(lab.receiver.home, workdir[2:], f"worker-{handle.hash}"))
    r = receiver.run(handle.command(["info"]))
    assert r.ok, r.stderr
    info = json.loads(r.stdout.splitlines()[-1])
    assert info["version"] == __version__ and info["native"].startswith(handle.directory)
    assert deploy.worker_version_problems(handle) == []

    t0 = time.monotonic()
    again = deploy.deploy(receiver, source_root=src, workdir=workdir)
    redeploy = time.monotonic() - t0
    print(f"first deploy {first:.2f}s, unchanged redeploy {redeploy * 1000:.1f} ms")
    assert again.reused and again.directory == handle.directory
    # reused: one hash check over SSH, no copy and no build (the first deploy compiles the worker core)
    assert redeploy < first / 3

    with open(os.path.join(src, "zcorch/units.py"), "a") as f:
        f.write("\n# a change\n")
    changed = deploy.deploy(receiver, source_root=src, workdir=workdir)
    assert not changed.reused and changed.hash != handle.hash
    listing = receiver.run(["ls", "-a", receiver.expand(workdir)]).stdout.split()
    assert f"worker-{changed.hash}" in listing and f"worker-{handle.hash}" in listing
    assert not [n for n in listing if n.startswith(".tmp-worker")]
    assert receiver.run(["grep", "-q", "a change", f"{changed.directory}/zcorch/units.py"]).ok

    # an incomplete directory under the right name (no completion marker) is replaced, not trusted
    receiver.run(["rm", f"{changed.directory}/{deploy.MARKER}"])
    receiver.run(["rm", "-r", f"{changed.directory}/zcorch"])
    fixed = deploy.deploy(receiver, source_root=src, workdir=workdir)
    assert not fixed.reused and receiver.run(fixed.command(["info"])).ok
    receiver.run(["rm", "-rf", receiver.expand(workdir)])
    assert lab.zcorch_procs("receiver") == []


@pytest.mark.lab
def test_failing_remote_build_reports_host_and_compiler_output(hosts, tmp_path):
    sender = hosts["sender"]
    src = _copy_sources(tmp_path / "src")
    victim = sorted(f for f in deploy.worker_sources(src) if f.endswith(".c"))[0]
    with open(os.path.join(src, victim), "a") as f:
        f.write("\nint zcorch_broken(void) { return syntax error here }\n")
    workdir = f"~/.cache/zcorch-test-{uuid.uuid4().hex[:8]}"
    with pytest.raises(DeployError) as exc:
        deploy.deploy(sender, source_root=src, workdir=workdir)
    msg = str(exc.value)
    assert msg.startswith("sender (root@") and "building the worker failed" in msg
    assert os.path.basename(victim) in msg and "error" in msg  # the compiler's own diagnostics
    listing = sender.run(["ls", "-a", sender.expand(workdir)]).stdout.split()
    assert not [n for n in listing if n.startswith(("worker-", ".tmp-worker"))]  # nothing half-built left
    sender.run(["rm", "-rf", sender.expand(workdir)])


@pytest.mark.lab
def test_preflight_reports_every_missing_piece_of_every_host(lab):
    from zcorch.hosts import ssh

    spec = lab.hosts_spec
    spec["sender"]["python"] = "/nonexistent/python3"
    spec["receiver"]["data_address"] = lab.sender.data  # not an address of the receiver
    opened = ssh.open_hosts(Hosts.from_mapping(spec))
    try:
        with pytest.raises(PreflightError) as exc:
            deploy.preflight(opened, tools={"receiver": [Tool("iperf3", "iperf3")]})
        msg = str(exc.value)
        print(msg)
        assert f"sender (root@{lab.sender.mgmt}): /nonexistent/python3 not found — apt-get install python3" in msg
        assert f"receiver (root@{lab.receiver.mgmt}): data_address {lab.sender.data} is not an address" in msg
    finally:
        for h in opened.values():
            h.close()


@pytest.mark.lab
def test_preflight_busy_port_and_prepare(hosts, lab):
    receiver = hosts["receiver"]
    # something really listening on the receiver's data address
    listener = receiver.start(["python3", "-c", "import socket,sys,time; s=socket.socket(); "
                               "s.bind((sys.argv[1], 0)); s.listen(); print(s.getsockname()[1], flush=True); "
                               "time.sleep(60)", lab.receiver.data])
    try:
        port = int(listener.readline(10))
        with pytest.raises(PreflightError, match=f"port {port} on {lab.receiver.data} is in use"):
            deploy.preflight(hosts, ports=[port])
    finally:
        listener.kill_group()
        listener.wait(10)
    both = {role: [Tool("iperf3", "iperf3"), Tool("qperf", "qperf")] for role in ("sender", "receiver")}
    facts = deploy.preflight(hosts, tools=both, ports=[port])
    assert facts["receiver"]["tools"]["iperf3"] and facts["receiver"]["tools"]["qperf"] and facts["sender"]["cffi"]
    handles = deploy.prepare(hosts, tools=both)
    for role, handle in handles.items():
        r = hosts[role].run(handle.worker_argv + ["info"], env=handle.env)
        assert r.ok and json.loads(r.stdout.splitlines()[-1])["version"] == __version__
    # A reused build: two commands per host, the probe (which also read the build's state) and `worker info`.
    ran = {role: [] for role in hosts}
    for role, host in hosts.items():
        host.run = (lambda real, log: lambda argv, **kw: log.append(argv) or real(argv, **kw))(host.run, ran[role])
    try:
        again = deploy.prepare(hosts, tools=both, info_args={"receiver": ["--metadata", lab.receiver.data, ""]})
    finally:
        for host in hosts.values():
            del host.run                                                # the class's own again
    for role in hosts:
        assert [next((a for a in ("preflight", "info") if a in argv), argv) for argv in ran[role]] == \
            ["preflight", "info"], ran[role]
        assert again[role].reused and again[role].info["version"] == __version__
    assert again["receiver"].info["metadata"]["interface"]["address"] == lab.receiver.data
    assert "metadata" not in again["sender"].info
    assert lab.zcorch_procs("sender") == [] and lab.zcorch_procs("receiver") == []


def test_localhost_preflight_busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        with pytest.raises(PreflightError, match=f"localhost: port {port} on 127.0.0.1 is in use"):
            deploy.preflight({"sender": LocalHost(), "receiver": LocalHost()}, ports=[port])
    finally:
        s.close()


def test_mode_problems_name_the_host_the_mode_and_why():
    info = {"modes": {"send": ["write", "io_uring_zc"], "recv": ["read", "zerocopy_recv"]},
            "unavailable": {"send": {"io_uring_zc": "io_uring is not permitted here (...)"},
                            "recv": {"zerocopy_recv": "this worker was built without struct tcp_zerocopy_receive "
                                                      "(...: Debian package linux-libc-dev); install or upgrade the "
                                                      "package and redeploy"}}}
    assert deploy.mode_problems("h1", info, {"send": ["write"], "recv": ["read"]}) == []
    assert deploy.mode_problems("h1", info, {"send": ["io_uring_zc", "write", "io_uring_zc"], "recv": ["zerocopy_recv"]}) == [
        "h1: send mode `io_uring_zc` cannot run there: io_uring is not permitted here (...)",
        "h1: receive mode `zerocopy_recv` cannot run there: this worker was built without struct tcp_zerocopy_receive "
        "(...: Debian package linux-libc-dev); install or upgrade the package and redeploy"]
    assert deploy.mode_problems("h1", info, {"send": ["warp"]}) == [
        "h1: the worker there has no send mode `warp` (it has write, io_uring_zc) — redeploy (delete the worker-* "
        "directory)"]
    # a dry run's worker info lists no modes: nothing to check
    assert deploy.mode_problems("h1", {"modes": {}}, {"send": ["warp"], "recv": ["io_uring"]}) == []
    # the cells were judged by the controller's copy of the capability table: a worker declaring other
    # capabilities for a mode the cells use would refuse (or run) other cells than the plan says
    from zcorch.config.capabilities_table import MODE_CAPABILITIES

    # write and read as the controller's table declares them; mmap with one capability too few
    caps = {"send": {"write": sorted(MODE_CAPABILITIES["send"]["write"]), "mmap": ["file_source"]},
            "recv": {"read": sorted(MODE_CAPABILITIES["recv"]["read"])}}
    info = {"modes": {"send": ["write", "mmap"], "recv": ["read"]}, "unavailable": {}, "capabilities": caps}
    assert deploy.mode_problems("h1", info, {"send": ["write"], "recv": ["read"]}) == []
    [problem] = deploy.mode_problems("h1", info, {"send": ["mmap", "write"]})
    assert problem.startswith("h1: the worker there declares send mode `mmap` with capabilities [file_source], "
                              "the plan's cell rules used [file_source, mappable_source]")
    assert "python -m zcorch.config.capabilities --write" in problem


def test_prepare_checks_the_cells_modes_on_each_host():
    host = LocalHost()
    handles = deploy.prepare({"sender": host, "receiver": host},
                             modes={"sender": {"send": ["write"]}, "receiver": {"recv": ["read"]}})
    assert set(handles) == {"sender", "receiver"}
    with pytest.raises(PreflightError) as ei:  # one host in both roles: both sides' modes are its own
        deploy.prepare({"sender": host, "receiver": host},
                       modes={"sender": {"send": ["write", "warp"]}, "receiver": {"recv": ["drift"]}})
    assert "no send mode `warp`" in str(ei.value) and "no receive mode `drift`" in str(ei.value)


def test_a_tool_on_path_without_its_execute_bit_is_found_but_not_executable(tmp_path, monkeypatch):
    # the host's own probe, on a PATH whose only iperf3 is a file without the execute bit
    from zcorch.worker.remote import preflight_facts

    (tmp_path / "iperf3").write_text("#!/bin/sh\n")
    (tmp_path / "iperf3").chmod(0o644)
    monkeypatch.setenv("PATH", str(tmp_path))
    facts = preflight_facts("127.0.0.1", (), ["iperf3", "qperf"])
    assert facts["tools"] == {"iperf3": None, "qperf": None}
    assert facts["tools_unrunnable"] == {"iperf3": str(tmp_path / "iperf3")}
    probs = deploy.host_problems(LocalHost("receiver", "127.0.0.1"), facts,
                                 tools=[Tool("iperf3", "iperf3"), Tool("qperf", "qperf")])
    assert probs == [f"receiver: iperf3 found at {tmp_path / 'iperf3'} but not executable — chmod +x it, or "
                     "apt-get install iperf3", "receiver: qperf not found — apt-get install qperf"]
