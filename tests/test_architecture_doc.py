"""docs/architecture.md stays true: its layout names every module of zcorch/ (in its package's entry) and every
file of native/ but the modes, and each file its "How to add" table names exists."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()


def layout_entries() -> dict:
    """{"zcorch/analysis/": the text of its entry, ..., "zcorch/": the core's, "native/": ...}."""
    block = DOC.split("## Layout and the import rule", 1)[1].split("```", 2)[1]
    groups: dict = {}
    current = None
    for line in block.splitlines():
        m = re.match(r"^(zcorch/\S*|native/)\s", line)
        if m:
            current = "zcorch/" if m.group(1).endswith(".py") else m.group(1)
        if current:
            groups[current] = groups.get(current, "") + " " + line
    return groups


def named(text: str, name: str) -> bool:
    """`name` appears as an entry of a layout list: `name.py`, or `name` followed by its description `(...)`,
    `:`, a separator or the end; a word in another module's description (`cli.py (the worker's command line)`
    for command.py) does not count. A file name with its suffix (`zc_core.h`) is specific enough anywhere."""
    if "." in name:
        return re.search(rf"(?<![\w.]){re.escape(name)}\b", text) is not None
    return re.search(rf"(?:^|(?<=[\s,(;/+])){re.escape(name)}(?=\.\w+\b|\s*[(:,;)+]|\s*$)", text) is not None


def test_a_module_is_named_by_an_entry_not_by_a_word():
    assert named("cli.py (the command line), native.py", "native") and named("a, command (one end)", "command")
    assert named("capabilities + capabilities_table (the copy)", "capabilities")
    assert not named("cli.py (the worker's command line), native.py", "command")
    assert not named("effective (the document run with --hosts / --set)", "hosts")


def test_the_layout_names_every_module_in_its_package():
    groups = layout_entries()
    missing = []
    for path in sorted((ROOT / "zcorch").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if path.name == "__init__.py" or path.name.startswith("_native") or "_native_src" in rel.parts:
            continue
        if len(rel.parts) == 2:
            key = "zcorch/"
            if path.stem == "plan":
                key = "zcorch/plan.py"
        else:
            key = f"zcorch/{rel.parts[1]}/"
        text = groups.get(key, "") + (groups.get("zcorch/", "") if key == "zcorch/plan.py" else "")
        if key == "zcorch/plan.py" or not named(text, path.stem):
            if key == "zcorch/plan.py" and "zcorch/plan.py" in DOC:
                continue
            missing.append(str(rel))
    for path in sorted((ROOT / "native").rglob("*")):
        if path.suffix in (".c", ".h", ".py") and path.parent.name != "modes" and "_build" not in path.parts:
            if not named(groups.get("native/", ""), path.name):
                missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"docs/architecture.md's layout does not name: {', '.join(missing)}"


def test_every_file_the_how_to_add_table_names_exists():
    table = DOC.split("## How to add", 1)[1].split("\n## ", 1)[0]
    # whole paths, and those written from inside zcorch/ or native/ (`config/baselines/registry.py`, `core/registry.c`)
    paths = set(re.findall(r"`([\w./-]+/[\w.-]+\.(?:py|c|h|j2|md|json))`", table))
    assert len(paths) >= 6, paths
    absent = sorted(p for p in paths if not any((base / p).exists() for base in (ROOT, ROOT / "zcorch", ROOT / "native")))
    assert not absent, f"the How to add table names files that do not exist: {absent}"


def test_the_host_jobs_named_are_the_ones_remote_runs():
    from zcorch.worker.remote import ACTIONS

    listed = re.search(r"`zcorch/worker/remote\.py` \(jobs: ([^)]*)\)", DOC)
    assert listed, "docs/architecture.md no longer lists the jobs of zcorch/worker/remote.py"
    assert [j.strip() for j in listed.group(1).split(",")] == list(ACTIONS)
