"""Every notebook in notebooks/ executes from a clean kernel and prints its answer."""

from __future__ import annotations

from pathlib import Path

import nbclient  # the [dev] extra installs these: missing is a failure, not a skip
import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9]*.ipynb"))


@pytest.mark.slow
@pytest.mark.notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_answers(path):
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=90, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    printed = "".join(o.get("text", "") for o in last.get("outputs", []) if o.get("name") == "stdout")
    assert any(ch.isdigit() for ch in printed), f"{path.name} ends without a numeric answer"


def test_notebooks_exist():
    assert len(NOTEBOOKS) == 6
