"""Every notebook runs top to bottom, shows its figures inline and writes
nothing into the repository; any cell error fails the suite."""
import subprocess
from pathlib import Path

import pytest

# The notebook runner is a test extra: a machine without it skips the module.
nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

# Host-side tools: on the CPU whatever SBM_PYG_TEST_DEVICE says.
pytestmark = pytest.mark.host

ROOT = Path(__file__).parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_notebooks_exist():
    assert [p.name for p in NOTEBOOKS] == ["01_sampling.ipynb", "02_theory.ipynb",
                                           "03_training.ipynb", "04_pyg.ipynb",
                                           "05_large.ipynb"]


def _untracked_and_modified() -> set:
    # Outside a git checkout (an sdist) there is nothing to compare.
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                          cwd=ROOT, capture_output=True, text=True)
    return set(done.stdout.splitlines()) if done.returncode == 0 else set()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_shows_its_figures(path):
    notebook = nbformat.read(path, as_version=4)
    before = _untracked_and_modified()
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}
                            ).execute()
    # Each cell that draws a figure displays it (a docs page without its
    # pictures is what a non-interactive backend gives).
    drawing = [c for c in notebook.cells if c.cell_type == "code"
               and ("plt.subplots(" in c.source or "Image(" in c.source)]
    assert drawing
    for cell in drawing:
        images = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert images, f"no figure shown by the cell:\n{cell.source[:200]}"
    assert _untracked_and_modified() == before, "the notebook wrote into the repository"
