"""A signal during a host command waits for the command's end (zcorch.hosts.critical): what the host did and
what the controller recorded stay the same thing. Real processes and real signals, in a child interpreter
with `zcorch run`'s guard installed."""
import os
import subprocess
import sys
import textwrap

from fixtures_run import REPO

PRELUDE = textwrap.dedent("""
    import os, signal, sys, threading, time
    from zcorch.hosts.local import LocalHost
    from zcorch.hosts.parallel import per_host
    from zcorch.sweep import interrupts
    out = sys.argv[1]
    host = LocalHost()

    def signal_in(seconds, sig=signal.SIGINT, times=1):
        def send():
            for _ in range(times):
                time.sleep(seconds)
                os.kill(os.getpid(), sig)
        threading.Thread(target=send, daemon=True).start()

    def step(name, seconds=0.6):   # a host change: its mark is written when it ends, not when it starts
        r = host.run(["sh", "-c", 'sleep "$1"; echo "$2" >> "$3"', "sh", str(seconds), name, out])
        assert r.ok, r
""")


def _child(tmp_path, body: str):
    out = tmp_path / "marks"
    out.write_text("")
    env = dict(os.environ, PYTHONPATH=REPO)
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body), str(out)], capture_output=True,
                       text=True, env=env, timeout=120)
    return p, out.read_text().split()


def test_ctrl_c_during_a_host_command_stops_once_it_ended(tmp_path):
    p, marks = _child(tmp_path, """
        guard = interrupts.InterruptGuard(prog="zcorch run")
        with guard.installed():
            try:
                signal_in(0.2)
                step("mounted")
                step("never")
            except KeyboardInterrupt:
                print("interrupted with", open(out).read().split())
    """)
    assert p.returncode == 0, p.stderr
    # the command had ended on the host when the interrupt came (what undo then finds is what was done)
    assert marks == ["mounted"] and "interrupted with ['mounted']" in p.stdout
    assert "SIGINT: stopping once `sh -c" in p.stderr and "on localhost ended" in p.stderr


def test_threads_finish_the_command_in_flight_start_no_other_and_the_teardown_runs_commands(tmp_path):
    p, marks = _child(tmp_path, """
        guard = interrupts.InterruptGuard()
        with guard.installed():
            try:
                signal_in(0.3)
                per_host(["a", "b"], lambda name: [step(f"{name}{i}") for i in range(3)])
                print("not interrupted")
            except KeyboardInterrupt as exc:
                print("interrupted with", sorted(open(out).read().split()))
                interrupts.begin_teardown()
                per_host(["a", "b"], lambda name: step(f"undo-{name}", 0.1))   # the teardown's own commands
                print("teardown done")
    """)
    assert p.returncode == 0, p.stderr
    # each host's first change ended; neither started its second; the teardown's commands all ran
    assert "interrupted with ['a0', 'b0']" in p.stdout, p.stdout + p.stderr
    assert sorted(marks) == ["a0", "b0", "undo-a", "undo-b"] and "teardown done" in p.stdout


def test_sigterm_is_held_too_and_names_itself(tmp_path):
    p, marks = _child(tmp_path, """
        from zcorch.errors import SignalInterrupt
        guard = interrupts.InterruptGuard()
        with guard.installed():
            try:
                signal_in(0.2, signal.SIGTERM)
                step("applied")
                step("never")
            except SignalInterrupt as exc:
                print("stopped by", signal.Signals(exc.signum).name)
    """)
    assert p.returncode == 0, p.stderr
    assert marks == ["applied"] and "stopped by SIGTERM" in p.stdout
    assert "SIGTERM: stopping once" in p.stderr


def test_a_third_ctrl_c_abandons_a_held_command_naming_what_is_left(tmp_path):
    p, marks = _child(tmp_path, """
        guard = interrupts.InterruptGuard()
        with guard.installed():
            interrupts.left_behind("filesystems", lambda: ["receiver: /mnt/x is still mounted"])
            signal_in(0.2, times=3)
            step("slow", 10)
            print("not abandoned")
    """)
    assert p.returncode == 130, p.stdout + p.stderr
    assert "not abandoned" not in p.stdout and marks == []
    assert "teardown abandoned (Ctrl-C pressed 3 times)" in p.stderr
    assert "receiver: /mnt/x is still mounted" in p.stderr


def test_without_the_guard_ctrl_c_interrupts_a_command_at_once(tmp_path):
    # A library caller (a notebook) that installed no guard keeps Python's own Ctrl-C: the command is killed.
    p, marks = _child(tmp_path, """
        t0 = time.monotonic()
        try:
            signal_in(0.2)
            step("slow", 10)
        except KeyboardInterrupt:
            print(f"interrupted after {time.monotonic() - t0:.1f}s")
    """)
    assert p.returncode == 0, p.stderr
    assert marks == [] and "interrupted after" in p.stdout
    assert float(p.stdout.split("after ")[1].rstrip("s\n")) < 5
