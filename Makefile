# Two commands on a fresh machine: `make demo` (the whole path on ML-100K) and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# The CPU build of PyTorch; GPU machines bring their own.
TORCH  ?= torch==2.13.0
DEMO   ?= runs/demo

.PHONY: demo test setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[all]"
	$(PIP) install -q --no-deps recbole  # only for the ML-100K files it ships
	bash scripts/install_perf_analyzer.sh $(PY)
	touch $(STAMP)

demo: $(STAMP)
	bash scripts/demo.sh $(DEMO)

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs build
