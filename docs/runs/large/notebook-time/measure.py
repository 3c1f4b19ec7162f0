"""Wall time of notebooks/05_large.ipynb executed whole (as
tests/test_notebooks.py runs it: nbclient, its own kernel, from notebooks/),
the kernel's start included, on a machine with nothing else running.

    python docs/runs/large/notebook-time/measure.py > docs/runs/large/notebook-time/output.log
"""
import time
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parents[4]  # the repository
path = ROOT / "notebooks" / "05_large.ipynb"
notebook = nbformat.read(path, as_version=4)
start = time.perf_counter()
nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                        resources={"metadata": {"path": str(path.parent)}}).execute()
print(f"{path.name}: {time.perf_counter() - start:.1f} s whole")
for cell in notebook.cells:
    if cell.cell_type == "code":
        for out in cell.get("outputs", []):
            if out.get("name") == "stdout":
                print(out["text"].rstrip())
