"""The copy-cost calibration cached on its host (zcorch.worker.calcache, `zcorch worker calibrate --cache`,
`zcorch run`'s calibrate stage): hit, each key change, age, --recalibrate, a corrupt or planted file."""
import json
import os
import subprocess
import sys

import pytest

from fixtures_run import REPO
from zcorch.worker import calcache

# A measurement stand-in for the unit tests: the real one takes seconds (the CLI tests below run it).
FIGURES = {"memcpy_s_per_gib": 0.1, "memcpy_gib_s": 10.0, "fault_ns_per_page": 500.0, "syscall_ns_per_call": 80.0}


class Measure:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return dict(FIGURES)


@pytest.fixture
def key_files(tmp_path):
    """The key's files as copies of this host's own. There is no real way to change a boot id, a kernel
    release or a CPU model from a test (and cpufreq governors exist on few test machines), so the key
    reader is pointed at these files, which the tests change."""
    d = tmp_path / "keyfiles"
    d.mkdir()
    files = {}
    for name, path in (("boot_id", calcache.KEY_FILES["boot_id"]), ("kernel", calcache.KEY_FILES["kernel"]),
                       ("cpuinfo", calcache.KEY_FILES["cpuinfo"])):
        with open(path) as f:
            (d / name).write_text(f.read())
        files[name] = str(d / name)
    (d / "cpu0").mkdir()
    (d / "cpu0" / "scaling_governor").write_text("performance\n")
    files["governors"] = str(d / "cpu[0-9]*" / "scaling_governor")
    return d, files


def cached(path, measure, files, **kw):
    return calcache.cached_calibration(str(path), measure, calcache.host_key(files), **kw)


def test_second_read_is_a_hit_with_its_age(tmp_path, key_files):
    _, files = key_files
    path, m = tmp_path / "w" / "calibration.json", Measure()
    first = cached(path, m, files, now=1000.0)
    assert first["cached"] is False and first["cache"]["status"] == "missing" and m.calls == 1
    doc = json.loads(path.read_text())
    second = cached(path, m, files, now=doc["measured_at"] + 30)
    assert second["cached"] is True and second["cache"]["status"] == "hit" and m.calls == 1
    assert second["age_s"] == pytest.approx(30) and second["memcpy_gib_s"] == FIGURES["memcpy_gib_s"]
    assert (path.parent.stat().st_mode & 0o777) == 0o700 and (path.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize("field, change", [
    ("boot_id", lambda d: (d / "boot_id").write_text("00000000-1111-2222-3333-444444444444\n")),
    ("kernel", lambda d: (d / "kernel").write_text("0.0.0-other\n")),
    ("cpu_model", lambda d: (d / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Another CPU @ 1.00GHz\n")),
    ("governor", lambda d: (d / "cpu0" / "scaling_governor").write_text("powersave\n")),
])
def test_each_key_change_measures_anew(tmp_path, key_files, field, change):
    d, files = key_files
    path, m = tmp_path / "calibration.json", Measure()
    cached(path, m, files)
    change(d)
    again = cached(path, m, files)
    assert m.calls == 2 and again["cached"] is False
    assert again["cache"]["status"] == "key changed" and again["cache"]["why"].startswith(field + ":")
    assert cached(path, m, files)["cached"] is True and m.calls == 2   # the new key is what is cached now


def test_age_and_refresh_measure_anew(tmp_path, key_files):
    _, files = key_files
    path, m = tmp_path / "calibration.json", Measure()
    cached(path, m, files)
    measured = json.loads(path.read_text())["measured_at"]
    old = cached(path, m, files, max_age_s=60, now=measured + 61)
    assert old["cache"]["status"] == "expired" and m.calls == 2
    fresh = cached(path, m, files, refresh=True)
    assert fresh["cache"]["status"] == "refresh" and fresh["cached"] is False and m.calls == 3


@pytest.mark.parametrize("content, why", [
    (b"{not json", "not JSON"),
    (b'{"format": "zcorch-calibration", "version": 1}', "measured_at"),
    (b"", "not JSON"),
])
def test_a_corrupt_file_is_measured_anew_and_said(tmp_path, key_files, content, why):
    _, files = key_files
    path, m = tmp_path / "calibration.json", Measure()
    cached(path, m, files)
    doc = json.loads(path.read_text())
    if why == "measured_at":   # the right format, a figure gone
        doc["calibration"].pop("memcpy_gib_s")
        content, why = json.dumps(doc).encode(), "calibration.memcpy_gib_s"
    path.write_bytes(content)
    again = cached(path, m, files)
    assert m.calls == 2 and again["cache"]["status"] == "untrusted" and why in again["cache"]["why"]
    assert calcache.read(str(path))["calibration"]["memcpy_gib_s"] == FIGURES["memcpy_gib_s"]   # replaced


def test_a_planted_symlink_is_never_followed_nor_written_through(tmp_path, key_files):
    _, files = key_files
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    path, m = tmp_path / "calibration.json", Measure()
    os.symlink(victim, path)
    got = cached(path, m, files)
    assert got["cache"]["status"] == "untrusted" and "symlink" in got["cache"]["why"]
    assert victim.read_text() == "precious\n"            # nothing written through the link
    assert not path.is_symlink() and calcache.read(str(path)) is not None   # the link was replaced by our file


def test_a_directory_others_can_write_is_refused(tmp_path, key_files):
    _, files = key_files
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    m = Measure()
    got = cached(shared / "calibration.json", m, files)
    assert got["cache"]["status"] == "not written" and "private" in got["cache"]["why"]
    assert got["cached"] is False and not (shared / "calibration.json").exists()


def worker(*args, home):
    env = dict(os.environ, PYTHONPATH=REPO, HOME=str(home))
    r = subprocess.run([sys.executable, "-m", "zcorch.worker", "calibrate", "--bytes", "4MiB", *args],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_worker_calibrate_with_cache_then_refresh(tmp_path):
    first = worker("--cache", "~/w/calibration.json", home=tmp_path)
    assert first["event"] == "calibration" and first["cached"] is False
    assert first["cache"]["path"] == str(tmp_path / "w" / "calibration.json")   # `~` of the host it runs on
    second = worker("--cache", "~/w/calibration.json", home=tmp_path)
    assert second["cached"] is True and second["memcpy_ns"] == first["memcpy_ns"] and second["age_s"] >= 0
    third = worker("--cache", "~/w/calibration.json", "--refresh", home=tmp_path)
    assert third["cached"] is False and third["cache"]["status"] == "refresh"
    other_size = worker("--cache", "~/w/calibration.json", "--bytes", "8MiB", home=tmp_path)
    assert other_size["cached"] is False and other_size["cache"]["why"].startswith("bytes:")


def test_lookup_is_read_only_and_says_what_a_measurement_would_record(tmp_path, key_files):
    """calcache.lookup (what `worker info --cache` answers): the hit cached_calibration would return, else
    the status and why it would record, never measuring nor writing."""
    _, files = key_files
    path = tmp_path / "calibration.json"
    key = calcache.host_key(files)
    assert calcache.lookup(str(path), key) == (None, "missing", None) and not path.exists()
    m = Measure()
    first = cached(path, m, files, now=1000.0)
    doc = calcache.read(str(path))
    before = path.read_bytes()
    hit, status, why = calcache.lookup(str(path), key, now=doc["measured_at"] + 30)
    assert status == "hit" and why is None
    assert hit == cached(path, m, files, now=doc["measured_at"] + 30) and m.calls == 1
    assert hit["memcpy_gib_s"] == first["memcpy_gib_s"] and hit["age_s"] == pytest.approx(30)
    assert calcache.lookup(str(path), key, max_age_s=10, now=doc["measured_at"] + 30)[1] == "expired"
    assert calcache.lookup(str(path), dict(key, kernel="9.9"))[1:] == ("key changed", f"kernel: {key['kernel']!r} -> '9.9'")
    assert path.read_bytes() == before


def info(*args, home):
    env = dict(os.environ, PYTHONPATH=REPO, HOME=str(home))
    r = subprocess.run([sys.executable, "-m", "zcorch.worker", "info", *args],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_worker_info_answers_the_cached_calibration_without_measuring(tmp_path):
    """`worker info --cache FILE`: what `calibrate --cache FILE` would reuse (the deploy's version check
    answers it, so a warm sweep needs no calibrate command), null when it would measure."""
    cache = tmp_path / "w" / "calibration.json"
    assert info("--cache", "~/w/calibration.json", home=tmp_path)["calibration"] is None and not cache.exists()
    env = dict(os.environ, PYTHONPATH=REPO, HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "zcorch.worker", "calibrate", "--cache", "~/w/calibration.json"],
                       capture_output=True, text=True, env=env, timeout=120)
    measured = json.loads(r.stdout.splitlines()[-1])
    assert r.returncode == 0 and measured["cached"] is False
    before = cache.read_bytes()
    got = info("--cache", "~/w/calibration.json", "--max-age", "1h", home=tmp_path)
    assert got["version"] and got["calibration"]["cached"] is True and got["calibration"]["age_s"] >= 0
    assert got["calibration"]["memcpy_ns"] == measured["memcpy_ns"] and cache.read_bytes() == before
    assert info("--cache", "~/w/calibration.json", "--max-age", "0s", home=tmp_path)["calibration"] is None
    assert "calibration" not in info(home=tmp_path)   # plain `info` as before


@pytest.mark.slow
def test_sweeps_reuse_the_hosts_calibration_until_told(tmp_path, tag, monkeypatch):
    """`zcorch run` (run_sweep) on localhost: the first sweep measures and caches, the next reuses it with its
    age in meta.json, a corrupt cache is measured anew and said, --recalibrate measures whatever is cached."""
    from fixtures_run import TAG_VAR
    from zcorch.sweep.pipeline import run_sweep

    monkeypatch.setenv("HOME", str(tmp_path / "home"))   # the host's workdir: ~/.cache/zcorch
    monkeypatch.setenv(TAG_VAR, tag)
    exp = tmp_path / "e.yaml"
    exp.write_text("name: e\nparams: {bytes: 64KiB}\nbaselines: {iperf3: false, dd: false}\n")

    def sweep(n, **kw):
        result = run_sweep(str(exp), output=str(tmp_path / f"rs{n}"), **kw)
        assert result.exit_status == 0, result.records
        meta = json.loads((tmp_path / f"rs{n}" / "meta.json").read_text())
        cal = meta["hosts"]["sender"]["calibration"]
        assert meta["hosts"]["receiver"]["calibration"] == cal   # localhost: one machine, one calibration
        return cal

    cache = tmp_path / "home" / ".cache" / "zcorch" / "calibration.json"
    first = sweep(1)
    assert first["cached"] is False and first["cache"] == {"path": str(cache), "status": "missing", "why": None}
    second = sweep(2)
    assert second["cached"] is True and second["age_s"] >= 0 and second["memcpy_ns"] == first["memcpy_ns"]
    cache.write_text("{garbage")
    third = sweep(3)
    assert third["cached"] is False and third["cache"]["status"] == "untrusted" and "not JSON" in third["cache"]["why"]
    fourth = sweep(4, recalibrate=True)
    assert fourth["cached"] is False and fourth["cache"]["status"] == "refresh"
    assert fourth["measured_at"] > third["measured_at"]
