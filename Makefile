# Two commands do all the set-up on a fresh clone: `make demo` and `make test` (`make help` lists the rest).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.installed

.PHONY: help install demo test lint test-fast toy-checkpoints bench bench-peers gpu-wheels gpu-check clean

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# Pinned torch: resolves from the local wheel cache on our machines (see README, "Two commands").
	$(PIP) install -q torch==2.14.1 torchvision==0.29.1
	$(PIP) install -q -e '.[all,dev]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install hardrank with every extra (ray, dali, report) and the dev tools

demo: $(STAMP)  ## evaluate the six toy checkpoints on the built-in toy world -> results/demo
	$(VENV)/bin/hardrank demo --out results/demo

lint: $(STAMP)  ## ruff over the whole repository
	$(VENV)/bin/ruff check .

# Two workers, one test file each at a time (--dist loadfile: a file's fixtures and Ray cluster stay in one
# process; each worker has its own temp folder and HARDRANK_CACHE). -p no:warnings: a worker's warning of a class
# the controller cannot import (a peer tool's own package) would stop the run. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile -p no:warnings)

test: lint  ## lint, then the test suite in 2 workers (CPU only, no downloads; what CI runs; about 9 min on 2 cores)
	$(PY) -m pytest -q -x --timeout=900 $(PYTEST_PARALLEL) tests

test-fast: $(STAMP)  ## the tests not marked slow (no Ray cluster, no real-size RoCOCO)
	$(PY) -m pytest -q -m "not slow" tests

toy-checkpoints: $(STAMP)  ## retrain the bundled toy checkpoints (deterministic, ~2 min)
	$(VENV)/bin/hardrank toy train --out engine/assets/toy_checkpoints

bench: $(STAMP)  ## the ranking kernels against a bare GEMM, FAISS flat and full-matrix baselines
	$(VENV)/bin/hardrank bench kernels

bench-peers: $(STAMP)  ## hardrank vs CLIP_benchmark, clip-retrieval, autofaiss (each in its own venv; minutes)
	$(PY) benchmarks/bench_peers.py

# The GPU check runs on a borrowed machine without network or .venv: no $(STAMP) prerequisite (see benchmarks/README.md).
GPU_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))

gpu-wheels:  ## download the wheels a borrowed GPU machine lacks (open_clip_torch, ftfy, wcwidth) into .gpu_wheels/
	$(GPU_PY) benchmarks/gpu_check.py --download-wheels

gpu-check:  ## CUDA tests + kernels/encoders/end to end vs hardware limits -> $OUT or benchmarks/results/gpu_check
	bash benchmarks/gpu_check.sh

clean:  ## remove results and caches (not .venv)
	rm -rf results .pytest_cache
