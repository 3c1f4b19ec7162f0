"""Sphinx configuration of the sbm_pyg documentation (``make docs``)."""
import sbm_pyg

project = "sbm_pyg"
author = "The sbm_pyg authors"
copyright = "2026, The sbm_pyg authors"
release = version = sbm_pyg.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    # MathJax 3 copied into the site and loaded from there: the math renders
    # offline.
    "sphinx-mathjax-offline",
    "sphinx.ext.intersphinx",
    "myst_nb",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "runs", "notebooks/README.md"]

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings give types and shapes
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = [("Shapes", "params_style")]

# The notebooks are executed at build time, so the rendered pages show the
# outputs of this version.
nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3

html_theme = "alabaster"
html_static_path: list = []
suppress_warnings = ["mystnb.unknown_mime_type"]
