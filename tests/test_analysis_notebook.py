"""notebooks/analysis.ipynb runs top to bottom (a real kernel) on the small real result set, as a user runs it:
with papermill's parameter (`-p RESULTS DIR`), and with no parameter from a directory where `zcorch run`
wrote its result sets (the newest is taken), outside the checkout; only zcorch's public API is used."""
import json

import nbformat
import pytest

from fixtures_analysis import ROOT, copy_result_set, repo_status

NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"


def _outputs(nb):
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"], [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    html = "\n".join(o.get("data", {}).get("text/html", "") for o in outputs)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    return text, html, images


def test_the_notebook_has_a_parameters_cell_and_uses_only_the_public_api():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "code" and "parameters" in first.metadata.get("tags", [])
    assert "RESULTS = None" in first.source
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "zcorch.analysis" not in code and "from zcorch" not in code   # zcorch.load, zcorch.summarize, ...


@pytest.mark.slow
def test_notebook_executes_with_papermills_parameter(small_set, tmp_path, monkeypatch):
    papermill = pytest.importorskip("papermill")
    before = repo_status("tests/data", "notebooks")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the kernel imports zcorch from this checkout
    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(str(NOTEBOOK), str(out), parameters={"RESULTS": str(small_set)},
                               cwd=str(tmp_path), kernel_name="python3", progress_bar=False)
    assert repo_status("tests/data", "notebooks") == before  # no cache, plot or checkpoint left in the repo
    text, html, images = _outputs(nbformat.read(out, as_version=4))
    assert "quickstart-small: 39 runs, 13 cells, 3 failed" in text
    assert "order statistics" in text
    assert "MB/s (" in html and "out of range" in html
    assert "\\n" not in html and "white-space: pre-line" in html   # two lines in a cell, not a literal \n
    assert len(images) >= 4  # bars (per buffer), buffer sweep, CPU, heatmaps


@pytest.mark.slow
def test_notebook_without_parameters_takes_the_newest_result_set_where_it_runs(small_set, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    work = tmp_path / "elsewhere"               # a user's directory, not the checkout
    older = copy_result_set(small_set, work / "results" / "quickstart-small-old")
    manifest = json.loads((older / "manifest.json").read_text())
    manifest["created"], manifest["name"] = "2000-01-01T00:00:00+00:00", "older"
    (older / "manifest.json").write_text(json.dumps(manifest))
    copy_result_set(small_set, work / "results" / "quickstart-small")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("ZCORCH_RESULTS", raising=False)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(work)}}).execute()
    text, _, _ = _outputs(nb)
    assert "quickstart-small: 39 runs, 13 cells, 3 failed" in text and "results/quickstart-small)" in text
