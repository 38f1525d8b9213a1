# Two commands on a fresh machine: `make demo` (the whole path on ML-100K) and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# The CPU build of PyTorch; GPU machines bring their own.
TORCH  ?= torch==2.13.0
DEMO   ?= runs/demo
# make demo PORTS="HTTP GRPC METRICS ENDPOINT" (empty: four free ports found on loopback)
PORTS  ?=

.PHONY: demo test lint format setup clean bench-gpu

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@date +%s > $(VENV)/.setup-started
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[all]"
	$(PIP) install -q --no-deps recbole  # only for the ML-100K files it ships
	bash scripts/install_perf_analyzer.sh $(PY)
	touch $(STAMP)
	@echo "[setup] .venv with recserve and its extras in $$(( $$(date +%s) - $$(cat $(VENV)/.setup-started) )) s" >&2

demo: $(STAMP)
	@start=$$(date +%s); bash scripts/build_triton_backends.sh $(PY) && \
	  echo "[demo] Triton's native backends in place after $$(( $$(date +%s) - start )) s" >&2
	PORTS="$(PORTS)" bash scripts/demo.sh $(DEMO)

test: $(STAMP)
	bash scripts/install_test_tools.sh  # promtool, prometheus and redis-cli, which only tests/deploy uses
	bash scripts/build_triton_backends.sh $(PY)  # Triton's native PyTorch and ONNX Runtime backends, once
	$(PY) -m pytest -q

# on a GPU host of one's own: the serving sweep and the training-scale benchmark (scripts/bench_gpu.sh)
bench-gpu: $(STAMP)
	bash scripts/bench_gpu.sh $(PY) runs/bench-gpu

# ruff (lint and format check) and mypy, configured in pyproject.toml
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts benchmarks native
	$(VENV)/bin/ruff format --check src tests scripts benchmarks native
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix src tests scripts benchmarks
	$(VENV)/bin/ruff format src tests scripts benchmarks

clean:
	rm -rf $(VENV) runs build
