"""The child of tests/safety/test_safety_openat.py: runs in its own network and mount namespaces
(`unshare -n -m`), so a worker that did escape would change only this namespace's
/proc/sys/net/ipv4/tcp_fin_timeout, and every mount it makes goes with it.

    python _openat_child.py race DIR ITERATIONS   -> JSON counts of the rename race
    python _openat_child.py walk DIR ITERATIONS   -> the same race against the component walk (no openat2)
    python _openat_child.py naive DIR SECONDS     -> the same race against check-the-name-then-open (control),
                                                    tried until it escapes or SECONDS pass
    python _openat_child.py mounts DIR            -> JSON verdicts on bind-mounted kernel paths and tmpfs
    python _openat_child.py layout DIR ITERATIONS [walk] -> JSON counts of the rename race against the
                                                    worker's `layout` (zcorch.worker.cli.layout, in this process)
    python _openat_child.py naive-layout DIR SECONDS  -> the same race against a layout that checks the
                                                    directory's name, then creates by name (control), tried
                                                    until it escapes or SECONDS pass

Uses the real worker core in this process (zcorch._native through zcorch.worker.native).
"""
from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import socket
import struct
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from zcorch.errors import WorkerError  # noqa: E402
from zcorch.worker import native  # noqa: E402

FIN = "/proc/sys/net/ipv4/tcp_fin_timeout"
HELLO_MAGIC = 0x325343a5
AT_FDCWD = -100
RENAME_EXCHANGE = 2


def exchange(a: str, b: str) -> None:
    """renameat2(RENAME_EXCHANGE): a and b swap places atomically (a directory and a symlink)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def swapper(pairs, stop) -> None:
    while not stop.is_set():
        for a, b in pairs:
            exchange(a, b)


def stand_in_sender(port: int, payload: bytes) -> None:
    """What the run's sender would send when the real one refused its source: a hello (zero nonce, one
    stream) and the bytes, so the receiver ends at once instead of at its timeout."""
    hello = struct.pack("<IIIIQQ", HELLO_MAGIC, 0, 1, 0, 0, len(payload)) + bytes(16)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(hello + payload)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def race(d: str, iterations: int) -> dict:
    os.makedirs(f"{d}/race")
    with open(f"{d}/race/tcp_fin_timeout", "w") as f:
        f.write("60\n")
    os.symlink("/proc/sys/net/ipv4", f"{d}/race.swap")
    os.makedirs(f"{d}/src")
    with open(f"{d}/src/full", "wb") as f:
        f.write(b"7\n")   # what the sink would write into tcp_fin_timeout, were it /proc's
    os.symlink("/dev", f"{d}/src.swap")
    before = read(FIN)
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=swapper, args=([(f"{d}/race", f"{d}/race.swap"),
                                                          (f"{d}/src", f"{d}/src.swap")], stop))
    proc.start()
    counts = {"iterations": 0, "sink_opened": 0, "sink_refused": 0, "source_opened": 0, "source_refused": 0,
              "sink_escapes": 0, "source_escapes": 0, "refusals": {}}
    try:
        t_end = time.monotonic() + 300
        for _ in range(iterations):
            if time.monotonic() > t_end:
                break
            counts["iterations"] += 1
            try:
                rx = native.Receiver("127.0.0.1", 0, "read", sink=f"{d}/race/tcp_fin_timeout", bytes=2, timeout=10)
                counts["sink_opened"] += 1
            except WorkerError as exc:
                counts["sink_refused"] += 1
                key = str(exc).split(":")[-1].strip()[:60]
                counts["refusals"][key] = counts["refusals"].get(key, 0) + 1
                rx = None
            out: dict = {}
            t = None
            if rx is not None:
                t = threading.Thread(target=lambda: out.setdefault("r", _run(rx)))
                t.start()
            try:
                if rx is not None:
                    native.send("127.0.0.1", rx.port, "write", source=f"{d}/src/full", bytes=2, timeout=10)
                else:  # no receiver: the source is still opened as a sender opens it
                    fd = native.open_file(f"{d}/src/full", "source")
                    got = os.read(fd, 2)
                    os.close(fd)
                    counts["source_escapes"] += got != b"7\n"
                counts["source_opened"] += 1
            except WorkerError as exc:
                counts["source_refused"] += 1
                key = str(exc).split(":")[-1].strip()[:60]
                counts["refusals"][key] = counts["refusals"].get(key, 0) + 1
                if rx is not None:
                    stand_in_sender(rx.port, b"7\n")
            if t is not None:
                t.join(15)
                rx.close()
            if read(FIN) != before:
                counts["sink_escapes"] += 1
            if "r" in out and isinstance(out["r"], dict) and out["r"].get("bytes") == 2:
                # the sink the receiver wrote is the real file (wherever the directory is now): never zeros
                for where in (f"{d}/race/tcp_fin_timeout", f"{d}/race.swap/tcp_fin_timeout"):
                    try:   # whichever is the real directory now (the link is refused)
                        fd = native.open_file(where, "source")
                    except WorkerError:
                        continue
                    counts["source_escapes"] += os.read(fd, 2) == b"\0\0"
                    os.close(fd)
    finally:
        stop.set()
        proc.join(10)
    counts["fin_before"] = before.decode().strip()
    counts["fin_after"] = read(FIN).decode().strip()
    return counts


def walk_race(d: str, iterations: int) -> dict:
    """The same race against the opener's component walk (what a kernel without openat2 gets), through
    zcorch.worker.native.open_file: every sink opened is written "7\n", every source opened read."""
    os.makedirs(f"{d}/race")
    os.symlink("/proc/sys/net/ipv4", f"{d}/race.swap")
    os.makedirs(f"{d}/src")
    with open(f"{d}/src/full", "wb") as f:
        f.write(b"7\n")
    os.symlink("/dev", f"{d}/src.swap")
    before = read(FIN)
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=swapper, args=([(f"{d}/race", f"{d}/race.swap"),
                                                          (f"{d}/src", f"{d}/src.swap")], stop))
    proc.start()
    counts = {"iterations": 0, "sink_opened": 0, "sink_refused": 0, "source_opened": 0, "source_refused": 0,
              "source_escapes": 0}
    try:
        for _ in range(iterations):
            counts["iterations"] += 1
            try:
                fd = native.open_file(f"{d}/race/tcp_fin_timeout", "sink", create=True, walk=True)
                try:
                    os.write(fd, b"7\n")
                finally:
                    os.close(fd)
                counts["sink_opened"] += 1
            except WorkerError:
                counts["sink_refused"] += 1
            try:
                fd = native.open_file(f"{d}/src/full", "source", walk=True)
                counts["source_escapes"] += os.read(fd, 2) != b"7\n"
                os.close(fd)
                counts["source_opened"] += 1
            except WorkerError:
                counts["source_refused"] += 1
    finally:
        stop.set()
        proc.join(10)
    counts["sink_escapes"] = int(read(FIN) != before)
    return counts


def naive_race(d: str, seconds: float) -> dict:
    """The control: the same race against a check of the name followed by an open of the name (what the
    worker once did: the resolved name judged, then open), to show the harness sees an escape. Bounded by
    time, not tries: on a loaded machine the swapper gets fewer turns, so the escape takes more tries."""
    os.makedirs(f"{d}/race")
    os.symlink("/proc/sys/net/ipv4", f"{d}/race.swap")
    before = read(FIN)
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=swapper, args=([(f"{d}/race", f"{d}/race.swap")], stop))
    proc.start()
    n, deadline = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and read(FIN) == before:
            n += 1
            try:
                if not os.path.realpath(f"{d}/race/tcp_fin_timeout").startswith(("/proc/", "/sys/")):
                    with open(f"{d}/race/tcp_fin_timeout", "wb") as f:
                        f.write(b"7\n")
            except OSError:
                pass
    finally:
        stop.set()
        proc.join(10)
    return {"iterations": n, "escaped": read(FIN) != before, "fin_after": read(FIN).decode().strip()}


LAID = 8192         # bytes of a new file laid out
SHORT = 4096        # a file laid out by a smaller sweep (grown to GROWN)
GROWN = 16384


def _layout_dirs(d: str) -> "tuple[str, str, str]":
    """d/race (where the files belong) swapped in a loop with d/race.swap, a link to d/outside (where nothing
    may ever be written); d/outside holds a file the grow would replace, were it reached."""
    race, outside = f"{d}/race", f"{d}/outside"
    os.makedirs(race)
    os.makedirs(outside)
    for where in (race, outside):
        with open(f"{where}/victim.dat", "wb") as f:
            f.write(native.mem_pattern(0, SHORT))
    os.symlink(outside, f"{d}/race.swap")
    return race, f"{d}/race.swap", outside


def _outside_state(outside: str) -> dict:
    return {name: (st.st_ino, st.st_size, st.st_mtime_ns) for name in sorted(os.listdir(outside))
            for st in [os.stat(os.path.join(outside, name), follow_symlinks=False)]}


def _real_dir(names) -> int:
    """A descriptor of whichever of `names` is the real directory right now (the other is the link)."""
    while True:
        for name in names:
            try:
                return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                pass


def _reset(names) -> None:
    """Put the real directory back as before an iteration: no new.dat, a short victim.dat."""
    rfd = _real_dir(names)
    try:
        for name in os.listdir(rfd):
            if name != "victim.dat":
                os.unlink(name, dir_fd=rfd)
        if os.stat("victim.dat", dir_fd=rfd).st_size != SHORT:
            fd = os.open("victim.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=rfd)
            os.write(fd, native.mem_pattern(0, SHORT))
            os.close(fd)
            os.replace("victim.tmp", "victim.dat", src_dir_fd=rfd, dst_dir_fd=rfd)
    finally:
        os.close(rfd)


def layout_race(d: str, iterations: int, walk: bool = False) -> dict:
    """The real `layout` (new files, and grows of a short laid-out file) while its directory is swapped for
    a link to another directory in a loop: every file must land in the real directory or be refused."""
    from zcorch.worker.cli import layout

    race, swap, outside = _layout_dirs(d)
    before = _outside_state(outside)
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=swapper, args=([(race, swap)], stop))
    proc.start()
    counts = {"iterations": 0, "created": 0, "grown": 0, "refused": 0, "escapes": 0, "refusals": {}}
    try:
        t_end = time.monotonic() + 300
        for i in range(iterations):
            if time.monotonic() > t_end:
                break
            counts["iterations"] += 1
            grow = i % 2 == 1
            try:
                if grow:
                    out = layout(f"{race}/victim.dat", GROWN, grow=True, walk=walk)
                    counts["grown"] += out.get("grown_from") == SHORT
                else:
                    out = layout(f"{race}/new.dat", LAID, walk=walk)
                    counts["created"] += bool(out["created"])
            except WorkerError as exc:
                counts["refused"] += 1
                key = str(exc).split(": ", 2)[-1][:70]
                counts["refusals"][key] = counts["refusals"].get(key, 0) + 1
            if _outside_state(outside) != before:
                counts["escapes"] += 1
                before = _outside_state(outside)
            _reset((race, swap))
    finally:
        stop.set()
        proc.join(10)
    counts["outside"] = sorted(os.listdir(outside))
    return counts


def naive_layout_race(d: str, seconds: float) -> dict:
    """The control: a layout that judges the directory by its name (no link in it), then creates the file by
    name, as the worker's layout did; the same swap loop shows the harness catches a file written outside.
    Tried until it escapes or `seconds` pass (a loaded machine needs more tries)."""
    race, swap, outside = _layout_dirs(d)
    before = _outside_state(outside)
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=swapper, args=([(race, swap)], stop))
    proc.start()
    n, deadline = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and _outside_state(outside) == before:
            n += 1
            try:
                if os.path.realpath(race) == race and not os.path.lexists(f"{race}/new.dat"):
                    fd = os.open(f"{race}/new.dat", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    os.write(fd, native.mem_pattern(0, LAID))
                    os.close(fd)
            except OSError:
                pass
            if _outside_state(outside) == before:
                _reset((race, swap))
    finally:
        stop.set()
        proc.join(10)
    return {"iterations": n, "escaped": _outside_state(outside) != before, "outside": sorted(os.listdir(outside))}


def _run(rx):
    try:
        return rx.run()
    except WorkerError as exc:
        return str(exc)


def verdict(fn) -> str:
    try:
        fd = fn()
    except WorkerError as exc:
        return f"refused {exc.code}: {exc}"
    os.close(fd)
    return "opened"


def mounts(d: str) -> dict:
    out = {}
    for sub in ("bind", "sysb", "devb", "tmpfs"):
        os.makedirs(f"{d}/{sub}")
    with open(f"{d}/onefile", "w") as f:
        f.write("x\n")
    subprocess.run(["mount", "--bind", "/proc/sys/net/ipv4", f"{d}/bind"], check=True)
    subprocess.run(["mount", "--bind", FIN, f"{d}/onefile"], check=True)
    subprocess.run(["mount", "--bind", "/sys/kernel", f"{d}/sysb"], check=True)
    subprocess.run(["mount", "--bind", "/dev", f"{d}/devb"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "zcorch-test", f"{d}/tmpfs"], check=True)
    before = read(FIN)
    out["bind_dir_sink"] = verdict(lambda: native.open_file(f"{d}/bind/tcp_fin_timeout", "sink", create=True))
    out["bind_file_sink"] = verdict(lambda: native.open_file(f"{d}/onefile", "sink", create=True))
    out["bind_dir_sink_walk"] = verdict(lambda: native.open_file(f"{d}/bind/tcp_fin_timeout", "sink", walk=True))
    out["sysfs_source"] = verdict(lambda: native.open_file(f"{d}/sysb/mm/transparent_hugepage/enabled", "source"))
    out["dev_full_source"] = verdict(lambda: native.open_file(f"{d}/devb/full", "source"))
    out["dev_zero_source"] = verdict(lambda: native.open_file(f"{d}/devb/zero", "source"))
    try:  # the real receiver, as the worker runs it
        native.Receiver("127.0.0.1", 0, "read", sink=f"{d}/bind/tcp_fin_timeout", bytes=2, timeout=2).close()
        out["receiver_bind"] = "opened"
    except WorkerError as exc:
        out["receiver_bind"] = f"refused {exc.code}: {exc}"
    # a regular file on tmpfs: accepted, and a transfer into it completes
    rx = native.Receiver("127.0.0.1", 0, "read", sink=f"{d}/tmpfs/out", bytes=1 << 20, timeout=10)
    res: dict = {}
    t = threading.Thread(target=lambda: res.setdefault("r", _run(rx)))
    t.start()
    native.send("127.0.0.1", rx.port, "write", source="mem", bytes=1 << 20, timeout=10)
    t.join(15)
    rx.close()
    out["tmpfs_bytes"] = res["r"]["bytes"] if isinstance(res.get("r"), dict) else res.get("r")
    out["tmpfs_size"] = os.path.getsize(f"{d}/tmpfs/out")
    out["fin_changed"] = read(FIN) != before
    return out


def main() -> None:
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "layout":    # files only: no namespace of its own needed (the test runs it as it is)
        print(json.dumps(layout_race(d, int(sys.argv[3]), walk=sys.argv[4:] == ["walk"])))
        return
    if mode == "naive-layout":
        print(json.dumps(naive_layout_race(d, float(sys.argv[3]))))
        return
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    if mode == "naive":
        result = naive_race(d, float(sys.argv[3]))
    else:
        result = {"race": race, "walk": walk_race}[mode](d, int(sys.argv[3])) if mode != "mounts" else mounts(d)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
