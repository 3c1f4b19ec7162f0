# `make test` and `make demo` create .venv on first use. torch is pinned to
# 2.13.0 and installed first: an unpinned torch pulls GBs of CUDA packages.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[test]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m sbm_pyg.demo

# Full benchmark suite (about 15 minutes on 2 CPU cores); writes
# benchmarks/results-cpu.json. Add ARGS="--device cuda" on a GPU.
bench: $(STAMP)
	$(PY) -m benchmarks.attention $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
