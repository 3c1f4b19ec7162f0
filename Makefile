# `make test` and `make demo` create .venv on first use. torch is pinned to
# 2.13.0 and installed first: an unpinned torch pulls GBs of CUDA packages.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[test]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m sbm_pyg.demo

clean:
	rm -rf $(VENV) .pytest_cache
