# `make test` and `make demo` create .venv on first use. torch is pinned to
# 2.13.0 and installed first: an unpinned torch pulls GBs of CUDA packages.
# The package is installed without build isolation so that its compiled
# kernels (setup.py, csrc/) build against that torch; without a compiler it
# installs on its pure-PyTorch path.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-slow lint docs demo bench clean

$(STAMP): pyproject.toml setup.py $(wildcard csrc/*.cpp csrc/*.h csrc/*/*.cpp csrc/*/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install torch==2.13.0 "setuptools>=77" wheel
	$(PY) -m pip install --no-build-isolation -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# The suite on every core (pytest-xdist), its end-to-end tests aside
# (marked `slow`: training to a target, the notebooks, the benchmarks'
# quick runs, the statistical tests of many draws): about 5 minutes on 2
# cores. `make test-slow` runs those (about 15 minutes); CI runs both.
test: $(STAMP)
	$(PY) -m pytest -q -n auto -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -n auto -m slow

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

# The documentation site (docs/_build/html); the notebooks are executed, so
# this takes a few minutes. Warnings are errors. It builds in the active
# virtualenv or conda environment when there is one (the package must be
# installed there; the docs tools are added), else in .venv; DOCS_PY=...
# picks another Python. MathJax is served from the site, not a CDN.
DOCS_ENV := $(or $(VIRTUAL_ENV),$(CONDA_PREFIX))
ifeq ($(DOCS_ENV),)
DOCS_PY ?= $(PY)
DOCS_NEEDS := $(STAMP)
else
DOCS_PY ?= $(DOCS_ENV)/bin/python
DOCS_NEEDS :=
endif

docs: $(DOCS_NEEDS)
	@$(DOCS_PY) -c "import sys; sys.path.pop(0); import sbm_pyg" 2>/dev/null || { echo "make docs: \
	sbm_pyg is not installed in $(DOCS_PY); pip install --no-build-isolation -e . first"; exit 1; }
	$(DOCS_PY) -m pip install -q "sphinx>=7" "myst-nb>=1.0" sphinx-mathjax-offline ipykernel matplotlib
	$(DOCS_PY) -m sphinx -b html -W --keep-going -q docs docs/_build/html

demo: $(STAMP)
	$(PY) -m sbm_pyg.demo

# Full benchmark suite (about 15 minutes on 2 CPU cores); writes
# benchmarks/results-cpu.json. Add ARGS="--device cuda" on a GPU.
bench: $(STAMP)
	$(PY) -m benchmarks $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache docs/_build
