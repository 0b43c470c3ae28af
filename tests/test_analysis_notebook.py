"""notebooks/analysis.ipynb runs top to bottom (nbclient, a real kernel) on the small real result set."""
import json

import nbformat
import pytest

from fixtures_analysis import ROOT, repo_status

NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"


@pytest.mark.slow
def test_notebook_executes_against_the_small_result_set(small_set, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    before = repo_status("tests/data", "notebooks")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "code" and 'RESULTS = "../tests/data/quickstart-small"' in first.source
    assert (NOTEBOOK.parent / "../tests/data/quickstart-small/runs.jsonl").exists()
    # run on a private copy so that the load cache is not written into the repository
    first.source = f"RESULTS = {json.dumps(str(small_set))}"
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the kernel imports zcorch from this checkout
    client.execute()
    assert repo_status("tests/data", "notebooks") == before  # no cache, plot or checkpoint left in the repo
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "quickstart-small: 39 runs, 13 cells, 3 failed" in text
    assert "order statistics" in text
    html = "\n".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "MB/s (" in html and "out of range" in html
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # bars (per buffer), buffer sweep, CPU, heatmaps
