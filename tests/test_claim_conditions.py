"""The conditions under which a published claim can be tested here (zcorch.conditions): the pure checks, the
`needs:` key of a claim (file:line errors), the workers' idle probe, and verdicts on a real localhost sweep.

What this machine's hosts were doing is not asserted: the sweep's verdicts are recomputed from the idle shares
its workers recorded; only a CPU count no host has (65536) is certain to fail."""
from __future__ import annotations

import json
import textwrap
import threading
from pathlib import Path

import jsonschema
import pytest

from zcorch import conditions as cond
from zcorch.analysis import reproduction as rp
from zcorch.analysis.report import build_report
from zcorch.analysis.summary import report_document, report_markdown
from zcorch.config.experiment import parse_experiment
from zcorch.errors import ConfigError
from zcorch.plan import expand
from zcorch.worker import hoststat

from fixtures_analysis import copy_result_set, record_sweep

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the checks, pure

def test_idle_hosts_is_met_when_at_least_half_the_runs_began_on_quiet_hosts():
    assert cond.check_idle([0.95, 0.9, 0.1, 0.85]).state == cond.MET
    busy = cond.check_idle([0.0, 0.02, 0.9])
    assert busy.state == cond.NOT_MET and "1 of 3 runs" in busy.detail and "median idle before a run 2%" in busy.detail
    assert cond.check_idle([None, float("nan")]).state == cond.UNKNOWN
    assert cond.check_idle([0.5], minimum=0.5).state == cond.MET        # the threshold itself counts as quiet


def test_one_kernel_needs_every_run_on_one_kernel():
    assert cond.check_one_kernel([True, True]).state == cond.MET
    assert cond.check_one_kernel([True, False]).state == cond.NOT_MET
    assert cond.check_one_kernel([None]).state == cond.UNKNOWN


def test_the_link_kind_splits_virtual_links_from_real_nics():
    assert cond.check_link(["loopback", "loopback"], virtual=True).state == cond.MET
    assert cond.check_link(["veth", "veth"], virtual=False).state == cond.NOT_MET
    assert cond.check_link(["device", "device"], virtual=False).state == cond.MET
    assert cond.check_link(["device", "veth"], virtual=True).state == cond.NOT_MET
    assert cond.check_link([None], virtual=True).state == cond.UNKNOWN


def test_data_against_ram():
    gib = 1 << 30
    assert cond.check_ram([gib], 4 * gib, inside=True).state == cond.MET
    assert cond.check_ram([3 * gib], 4 * gib, inside=True).state == cond.NOT_MET   # beyond half the memory
    assert cond.check_ram([5 * gib, 8 * gib], 4 * gib, inside=False).state == cond.MET
    assert cond.check_ram([2 * gib, 8 * gib], 4 * gib, inside=False).state == cond.NOT_MET
    assert cond.check_ram([gib], None, inside=True).state == cond.UNKNOWN


def test_cpus_counts_the_distinct_cpus_named_or_the_claims_own_number():
    assert cond.check_cpus([0, 1, 0], have=2).state == cond.MET
    few = cond.check_cpus([0, 1], have=1)
    assert few.state == cond.NOT_MET and "CPU 1 named" in few.detail
    assert cond.check_cpus([0, 1], have=2, at_least=3).state == cond.NOT_MET
    assert cond.check_cpus([], have=None).state == cond.UNKNOWN


def test_only_a_condition_not_met_makes_a_claim_untestable():
    checks = [cond.Check("a", cond.MET, "x"), cond.Check("b", cond.UNKNOWN, "y"), cond.Check("c", cond.NOT_MET, "z")]
    assert cond.untestable_reason(checks) == "c: z"
    assert cond.untestable_reason(checks[:2]) == ""


def test_idle_share_of_two_proc_stat_texts():
    before = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 100 0 50 800 50 0 0 0 0 0\n"
    after = "cpu  150 0 100 1000 100 0 0 0 0 0\ncpu0 150 0 100 1000 100 0 0 0 0 0\n"
    assert hoststat.idle_share(before, after) == pytest.approx(250 / 350)   # idle + iowait of every tick
    assert hoststat.idle_share(before, before) is None                      # no tick passed
    assert hoststat.idle_share(None, after) is None


# ---------------------------------------------------------------- `needs:` in a claim

HEAD = """\
name: t
params: {source: /dev/zero, sink: /dev/null, idle_probe: 50ms}
matrix:
  pinning:
    - {label: same, send_cpu: 0, recv_cpu: 0}
    - {label: apart, send_cpu: 0, recv_cpu: 1}
reference:
  source: {title: A study}
  claims:
    - says: same is slower
      metric: mb_s
      a: {recv_cpu: 0}
      b: {recv_cpu: 1}
      holds_if: a < b
"""


def errors(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        expand(parse_experiment(textwrap.dedent(text), "exp.yaml"))
    return str(info.value)


STUDY = "  source: {title: A study}\n"


def study_needs(text: str, needs: str) -> str:
    """`text` with `needs` declared for the whole study (reference.needs), one line below its source."""
    return text.replace(STUDY, STUDY + f"  needs: {needs}\n")


def test_needs_is_parsed_with_numbers():
    exp = parse_experiment(study_needs(HEAD, "[idle_hosts]") + "      needs: [{cpus: 3}, one_kernel]\n", "exp.yaml")
    assert exp.reference.needs == (("idle_hosts", None),)
    assert exp.reference.claims[0].needs == (("idle_hosts", None), ("cpus", 3), ("one_kernel", None))


def test_the_hosts_state_is_every_claims_of_the_study():
    # one policy for a study: the quiet-hosts condition named by one claim is every claim's
    second = HEAD.split("reference:")[1].split("  claims:\n")[1].replace("same is slower", "apart is faster")
    exp = parse_experiment(HEAD + "      needs: [idle_hosts, one_kernel]\n" + second, "exp.yaml")
    first, other = exp.reference.claims
    assert first.needs == (("idle_hosts", None), ("one_kernel", None)) and other.needs == (("idle_hosts", None),)
    assert exp.reference.needs == (("idle_hosts", None),)
    text = errors(study_needs(HEAD, "[idle_hostz]"))
    assert "exp.yaml:9:" in text and "reference.needs[0]" in text and "did you mean `idle_hosts`" in text, text


@pytest.mark.parametrize("needs, line, words", [
    ("[one_kernels]", 15, "`one_kernels` is not a condition; did you mean `one_kernel`?"),
    ("[cpus, cpus]", 15, "`cpus` is named twice"),
    ("[{one_kernel: 2}]", 15, "`one_kernel` takes no number"),
    ("[{cpus: 0}]", 15, "expected an integer between 1 and"),
    ("one_kernel", 15, "expected a list"),
])
def test_needs_errors_name_file_line_and_key(needs, line, words):
    text = errors(HEAD + f"      needs: {needs}\n")
    assert f"exp.yaml:{line}:" in text and "reference.claims[0].needs" in text and words in text, text


def test_idle_hosts_needs_the_cells_to_probe():
    text = errors(study_needs(HEAD.replace(", idle_probe: 50ms", ""), "[idle_hosts]"))
    assert "exp.yaml:11:" in text and "reference.claims[0].needs" in text and "idle_probe" in text, text


def test_the_shipped_pinning_study_needs_quiet_hosts_and_its_cpus():
    exp = parse_experiment((ROOT / "experiments/sendfile-pinning-2001.yaml").read_text(), "morton.yaml")
    pinning = [c for c in exp.reference.claims if "same CPU" in c.says]
    assert len(pinning) == 2 and all(c.need("idle_hosts") and c.need("cpus") for c in pinning)
    # and so does the sendfile-against-send(8k) claim of the same runs: one policy for the study
    assert all(c.need("idle_hosts") for c in exp.reference.claims) and len(exp.reference.claims) == 3
    assert expand(exp).cells[0].params["idle_probe"] == 0.2


# ---------------------------------------------------------------- the worker's probe

def test_the_workers_record_the_idle_share_before_they_start(tmp_path):
    from zcorch.worker import native
    out = {}
    with native.Receiver("127.0.0.1", 0, "read", sink="/dev/null", timeout=20, idle_probe=0.05) as rx:
        t = threading.Thread(target=lambda: out.update(recv=rx.run()))
        t.start()
        sent = native.send("127.0.0.1", rx.port, "write", source="mem", bytes=1 << 20, timeout=20, idle_probe=0.05)
        t.join()
    for result in (sent, out["recv"]):
        share = result["host_idle_before"]
        assert share is None or 0.0 <= share <= 1.0        # None only when no /proc/stat tick passed in 50 ms
    unprobed = native.send  # without idle_probe nothing is probed
    with native.Receiver("127.0.0.1", 0, "read", sink="/dev/null", timeout=20) as rx:
        t = threading.Thread(target=lambda: out.update(recv=rx.run()))
        t.start()
        sent = unprobed("127.0.0.1", rx.port, "write", source="mem", bytes=1 << 20, timeout=20)
        t.join()
    assert sent["host_idle_before"] is None and out["recv"]["host_idle_before"] is None


# ---------------------------------------------------------------- verdicts on a real sweep

SWEEP = study_needs(HEAD.replace("params: {", "params: {bytes: 8MiB, timeout: 30s, sample_interval: null, "),
                    "[idle_hosts]") + """\
      needs: [one_kernel, virtual_link, cpus]
    - says: same is slower, on a machine of many CPUs
      metric: mb_s
      a: {recv_cpu: 0}
      b: {recv_cpu: 1}
      holds_if: a < b
      needs: [{cpus: 65536}]
    - says: same is slower, with the study's conditions only
      metric: mb_s
      a: {recv_cpu: 0}
      b: {recv_cpu: 1}
      holds_if: a < b
repeats: 5
baselines: {iperf3: false, dd: false}
"""


@pytest.fixture(scope="module")
def pinning_recorded(tmp_path_factory) -> Path:
    return record_sweep(tmp_path_factory.mktemp("pinning"), "pinning", SWEEP)


def _rewrite_idle(src: Path, dst: Path, share: float) -> Path:
    """A copy of a recorded set whose workers' idle probes read `share`: a busy or a quiet machine on demand,
    which a real part cannot produce while other work shares this one (the only edited field)."""
    d = copy_result_set(src, dst)
    lines = []
    for line in (d / "runs.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for side in ("sender", "receiver"):
            rec[side]["host_idle_before"] = share
        lines.append(json.dumps(rec))
    (d / "runs.jsonl").write_text("\n".join(lines) + "\n")
    return d


def _claims(d: Path):
    import zcorch
    from zcorch.analysis.frames import read_meta
    exp = parse_experiment((d / "experiment.yaml").read_text(), "exp.yaml")
    return rp.claims(zcorch.load(d), exp.reference, zcorch.load_baselines(d), rp.host_facts(read_meta(d)))


@pytest.mark.slow
def test_the_recorded_idle_shares_decide_the_idle_condition(pinning_recorded, tmp_path):
    d = copy_result_set(pinning_recorded, tmp_path / "set")
    records = [json.loads(x) for x in (d / "runs.jsonl").read_text().splitlines()]
    per_run = []
    for rec in records:
        shares = [rec[s]["host_idle_before"] for s in ("sender", "receiver") if rec[s]["host_idle_before"] is not None]
        assert all(0.0 <= s <= 1.0 for s in shares)
        per_run.append(min(shares) if shares else None)
    known = [s for s in per_run if s is not None]
    quiet = 2 * sum(s >= cond.IDLE_MIN for s in known) >= len(known)
    first, many, plain = _claims(d)
    idle = next(c for c in first.checks if c.name == "idle_hosts")
    assert idle.state == (cond.UNKNOWN if not known else cond.MET if quiet else cond.NOT_MET)
    assert (first.verdict == rp.UNTESTABLE) == (idle.state == cond.NOT_MET)
    assert {c.name: c.state for c in first.checks}["one_kernel"] == cond.MET     # a localhost sweep
    assert many.verdict == rp.UNTESTABLE and "cpus:" in many.evidence and "the claim needs 65536" in many.evidence
    assert [c.name for c in plain.checks] == ["idle_hosts"]
    # one policy: the claim without conditions of its own is untestable exactly when the first is for idleness
    assert (plain.verdict == rp.UNTESTABLE) == (idle.state == cond.NOT_MET)


@pytest.mark.slow
def test_busy_hosts_make_a_pinning_claim_untestable_everywhere_it_is_shown(pinning_recorded, tmp_path):
    d = _rewrite_idle(pinning_recorded, tmp_path / "busy", 0.0)
    first = _claims(d)[0]
    assert first.verdict == rp.UNTESTABLE and "idle_hosts: 0 of 10 runs began on quiet hosts" in first.evidence
    assert all(c.verdict == rp.UNTESTABLE for c in _claims(d))   # every claim of the study, not the pinning alone
    md = report_markdown(d)
    row = next(line for line in md.splitlines() if line.startswith("| same is slower |"))
    assert "| untestable here | " in row and "✗ idle_hosts: 0 of 10 runs" in row and "✓ one_kernel" in row
    assert "(3 untestable here)" in md
    doc = report_document(d)
    jsonschema.validate(json.loads(json.dumps(doc)), json.loads((ROOT / "docs/schemas/report.schema.json").read_text()))
    entry = doc["reproduction"]["conditions"][0]
    assert entry["verdict"] == "untestable here"
    assert {"condition": "idle_hosts", "state": "not met"}.items() <= entry["checks"][0].items()
    assert doc["reproduction"]["claims"][0]["conditions here"].startswith("✗ idle_hosts")
    page = build_report(d)
    assert 'class="verdict untestable-here">untestable here</td><td>✗ idle_hosts' in page


def test_quiet_hosts_leave_the_verdict_to_the_numbers(pinning_recorded, tmp_path):
    d = _rewrite_idle(pinning_recorded, tmp_path / "quiet", 1.0)
    first, _, plain = _claims(d)
    assert next(c for c in first.checks if c.name == "idle_hosts").state == cond.MET
    assert first.verdict == plain.verdict != rp.UNTESTABLE   # the same cells, the same numbers


# ---------------------------------------------------------------- each shipped study, on this machine

STUDIES = ("sendfile-pinning-2001", "zero-copy-output-2011", "splice-write-benchmark", "schutt-2006",
           "ext4-nodelalloc-2011")


def _this_machine_verdicts(study: str, tmp_path: Path):
    """The shipped study file's claims on the runs this machine recorded of it (tests/data/reproductions, a lab
    of two network namespaces joined by veth for Schutt and ext4), with the md driver probed here and now."""
    import zcorch
    from zcorch.analysis.frames import read_meta
    from zcorch.config.experiment import reference_of
    from zcorch.worker.remote import host_metadata
    d = copy_result_set(ROOT / "tests/data/reproductions" / study, tmp_path / study)
    ref = reference_of((ROOT / "experiments" / f"{study}.yaml").read_text(), f"{study}.yaml")
    meta = read_meta(d)
    here = host_metadata("127.0.0.1", str(tmp_path), ())
    meta["hosts"]["receiver"]["md_driver"] = here["md_driver"]     # what a run records now (older sets did not)
    rows = rp.claims(zcorch.load(d), ref, zcorch.load_baselines(d), rp.host_facts(meta))
    return ref, rows, here


@pytest.mark.parametrize("study", STUDIES)
def test_each_study_declares_its_setting_and_this_machine_is_checked_against_it(study, tmp_path):
    ref, rows, here = _this_machine_verdicts(study, tmp_path)
    assert ref.needs and rows and all(r.checks for r in rows)
    states = [{c.name: c.state for c in r.checks} for r in rows]
    for r in rows:
        print(f"{study}: {r.verdict_text} — {r.claim.says}\n    {rp.conditions_text(r)}")
    # one policy: every claim of a study is checked on the study's whole setting
    assert all(set(dict(ref.needs)) <= set(s) for s in states)
    if study in ("schutt-2006", "ext4-nodelalloc-2011"):
        # a lab here: veth between two namespaces, 4 MiB transfers on 24 GiB hosts, single loop devices
        assert all(r.verdict == rp.UNTESTABLE for r in rows)
        assert all(s["data_beyond_ram"] == cond.NOT_MET for s in states)
    if study == "schutt-2006":
        assert all(s["real_nic"] == cond.NOT_MET for s in states)
        assert "the data link is veth" in rows[0].evidence
        # the send claims read a file from the page cache; the receive claims read /dev/zero
        assert states[0]["disk_source"] == cond.NOT_MET and "read from the page cache" in rows[0].evidence
        assert states[4]["disk_source"] == cond.MET
    if study == "ext4-nodelalloc-2011":
        assert all(s["md_raid"] == cond.NOT_MET for s in states)
        md = next(c for c in rows[0].checks if c.name == "md_raid")
        assert "1 loop device without md RAID" in md.detail
        assert ("the receiver's kernel has no md" in md.detail) == (not here["md_driver"])
        assert states[2]["real_nic"] == cond.NOT_MET and "real_nic" not in states[0]
    if study in ("sendfile-pinning-2001", "zero-copy-output-2011", "splice-write-benchmark"):
        # loopback on one kernel is what these studies ran on: their setting holds here
        assert all(s["one_kernel"] == cond.MET and s["virtual_link"] == cond.MET for s in states)
    if study == "zero-copy-output-2011":
        # the write cells fill every message as the blog's did; the vmsplice cells cannot: the real-time claim
        # measures the filling, so it is untestable; the sys-time claim does not need alike user work
        assert "same_sender_work" not in states[0] and states[1]["same_sender_work"] == cond.NOT_MET
        assert rows[1].verdict == rp.UNTESTABLE and "s/GiB" in rows[1].evidence
    if study == "sendfile-pinning-2001":
        assert all(s["data_in_ram"] == cond.MET for s in states)
        idle = [s["idle_hosts"] for s in states]
        assert len(set(idle)) == 1          # the same runs, the same hosts: one state for all three claims
        assert all((r.verdict == rp.UNTESTABLE) == (idle[0] == cond.NOT_MET) for r in rows)


def test_the_workers_host_record_says_whether_the_kernel_has_md(tmp_path):
    from zcorch.worker.remote import host_metadata
    assert host_metadata("127.0.0.1", str(tmp_path), ())["md_driver"] == Path("/proc/mdstat").exists()


def test_md_raid_is_met_only_on_an_assembled_md_array():
    fs = {"raid": "raid5", "mount_source": "/dev/md127", "devices": [{"path": "/dev/loop1"}] * 3}
    assert cond.check_md_raid([("ext4", fs)], True).state == cond.MET
    plain = {"raid": None, "mount_source": "/dev/loop0", "devices": [{"path": "/dev/loop0"}]}
    check = cond.check_md_raid([("ext4", plain)], False)
    assert check.state == cond.NOT_MET and check.detail == ("ext4 is 1 loop device without md RAID; the receiver's "
                                                            "kernel has no md (/proc/mdstat absent)")
    assert cond.check_md_raid([("ext4", None)], None).state == cond.UNKNOWN


def test_alike_sender_work_compares_the_sides_user_cpu_per_gib():
    assert cond.check_sender_work([0.10, 0.12], [0.15, 0.2]).state == cond.MET            # 1.5x apart
    filled = cond.check_sender_work([0.007, 0.008], [2.8, 2.9])
    assert filled.state == cond.NOT_MET and "a 0.0075 s/GiB, b 2.85 s/GiB" in filled.detail
    assert cond.check_sender_work([1.0], [2.5], 3).state == cond.MET                      # its own factor
    assert cond.check_sender_work([1.0], [2.5]).state == cond.NOT_MET                     # the default: 2x
    assert cond.check_sender_work([0.0], [0.5]).state == cond.NOT_MET                     # none against some
    assert cond.check_sender_work([0.0], [0.0]).state == cond.MET                         # none on both sides
    assert cond.check_sender_work([None], [1.0]).state == cond.UNKNOWN


def test_a_source_larger_than_the_senders_memory_comes_from_the_disk():
    gib = 1 << 30
    assert cond.check_disk_source([16 * gib], gib).state == cond.MET
    assert cond.check_disk_source([gib], 24 * gib).state == cond.NOT_MET
    assert cond.check_disk_source([], 24 * gib).state == cond.MET       # no file source in these runs
    assert cond.check_disk_source([gib], None).state == cond.UNKNOWN
