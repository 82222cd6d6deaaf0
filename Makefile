# Two commands do all the set-up on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast toy-checkpoints bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# Pinned torch: resolves from the local wheel cache on our machines (see README).
	$(PIP) install -q torch==2.14.1 torchvision==0.29.1
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hardrank demo --out results/demo

test: $(STAMP)
	$(PY) -m pytest -q -x --timeout=900 tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

toy-checkpoints: $(STAMP)
	$(VENV)/bin/hardrank toy train --out engine/data/toy_checkpoints

bench: $(STAMP)
	$(VENV)/bin/hardrank bench kernels

clean:
	rm -rf results .pytest_cache
