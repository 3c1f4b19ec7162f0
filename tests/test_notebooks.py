"""Every notebook runs top to bottom; any cell error fails the suite."""
from pathlib import Path

import nbclient
import nbformat
import pytest

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def test_notebooks_exist():
    assert [p.name for p in NOTEBOOKS] == ["01_sampling.ipynb", "02_theory.ipynb",
                                           "03_training.ipynb", "04_pyg.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    # Figures go to a temporary directory, not into docs/figures.
    monkeypatch.setenv("SBM_PYG_FIGURES", str(tmp_path))
    notebook = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}
                            ).execute()
    assert list(tmp_path.glob("*.png")), "the notebook wrote no figure"
