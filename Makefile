# The README's two commands are `make demo` and `make test`; each does its own set-up on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-core
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install install-test demo ui test test-fast clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=25.1"
	# CPU torch first (the wheel on the machine); the constraint keeps every later install on it.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps --group no-deps
	touch $@

install: $(STAMP)

# llama-cpp-python has no wheel here: it builds from source (~5 min, then pip's cache serves it). Only the tests
# need it (a real OpenAI-compatible server on loopback), so `make demo` does not wait for it.
LLAMA_STAMP := $(VENV)/.installed-llama
$(LLAMA_STAMP): $(STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(PY) -m pip install -q "llama-cpp-python[server]==0.3.36"
	touch $@

install-test: $(STAMP) $(LLAMA_STAMP)

demo: install
	$(PY) -m batch_assets.demo

ui: install
	mkdir -p $(DAGSTER_HOME) && cp dagster.yaml $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dagster dev -w workspace.yaml

test: install-test
	$(BIN)/pytest -q -ra

test-fast: install-test
	$(BIN)/pytest -q -ra -m "not slow"

clean:
	rm -rf .dagster_home data .pytest_cache
