# Two commands matter: `make serve` and `make test`. Both create .venv and install on first use,
# .venv-atropos, the interpreter Atropos environments run in (docs/atropos.md), and
# .venv-verifiers, the one verifiers environments run in (docs/verifiers.md).
# Python 3.11: uv.lock pins what runs the server (Linux x86-64, Python 3.11, the CPU build of torch).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# NO_MKDOCS_2_WARNING: the docs theme's notice about its own future, printed on every build.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build
# Everything `make serve` and `make test` need, exactly as uv.lock pins it; .venv holds nothing else.
# Bytecode compiled once here, as pip did: where PYTHONDONTWRITEBYTECODE is set (this machine, the
# image) every process would otherwise compile what it imports, which doubles the tests' CPU
# time; and a dependency's SyntaxWarning (cellpylib's `is` with a literal) would be raised on
# import, an error under the tests' filterwarnings.
SYNC := $(BIN)/uv sync --locked --compile-bytecode --extra dev --extra all --group models
# What `make test-fast` leaves out: the test lanes, which tests/conftest.py gives by folder (markers
# declared in pyproject.toml; tests/tinker_api is slow). The rest: at most 3 minutes on 2 cores.
NOT_FAST := browser or ray or postgres or install or training or slow or atropos or verifiers
# A second interpreter for Atropos environments: atroposlib pins nothing and needs transformers
# 4 (its chat tokenization); ours has 5 and torch. Pinned by its own lock, as uv.lock pins ours.
ATROPOS_VENV := .venv-atropos
ATROPOS_STAMP := $(ATROPOS_VENV)/.installed
ATROPOS_LOCK := runners/atropos/requirements.lock
# Another for verifiers environments: verifiers pins openai, mcp and websockets apart from ours;
# 0.3 serves both generations (v0 and v1). Pinned by its own lock.
VERIFIERS_VENV := .venv-verifiers
VERIFIERS_STAMP := $(VERIFIERS_VENV)/.installed
VERIFIERS_LOCK := runners/verifiers/requirements.lock
# A third, for the Tinker API tests: the oldest tinker SDK the server serves (the protobuf era
# began with 0.25.0), beside the project's 0.38 (tests/tinker_api/test_sdk_versions.py).
OLDEST_SDK_VENV := .venv-tinker-oldest
OLDEST_SDK_STAMP := $(OLDEST_SDK_VENV)/.installed
OLDEST_SDK_LOCK := tests/tinker_api/sdk_oldest/requirements.lock

.PHONY: serve test test-fast install verifiers-deps lock lint typecheck format docs demo curves clean

# uv from PyPI, in the venv it fills (the dev extra keeps it there).
$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet 'uv>=0.13,<0.14'

$(STAMP): pyproject.toml uv.lock Makefile | $(BIN)/uv
	$(PYTHON) scripts/torch_wheel.py
	$(SYNC)
	# SmolLM2 converted once here, not by the first request (it takes most of 20 s).
	$(BIN)/python -m runners.models.prepare
	touch $(STAMP)

$(ATROPOS_STAMP): $(ATROPOS_LOCK) | $(BIN)/uv
	test -x $(ATROPOS_VENV)/bin/python || $(PYTHON) -m venv $(ATROPOS_VENV)
	$(BIN)/uv pip sync --quiet --python $(ATROPOS_VENV)/bin/python --compile-bytecode $(ATROPOS_LOCK)
	touch $(ATROPOS_STAMP)

$(VERIFIERS_STAMP): $(VERIFIERS_LOCK) | $(BIN)/uv
	test -x $(VERIFIERS_VENV)/bin/python || $(PYTHON) -m venv $(VERIFIERS_VENV)
	$(BIN)/uv pip sync --quiet --python $(VERIFIERS_VENV)/bin/python --compile-bytecode $(VERIFIERS_LOCK)
	touch $(VERIFIERS_STAMP)

$(OLDEST_SDK_STAMP): $(OLDEST_SDK_LOCK) | $(BIN)/uv
	test -x $(OLDEST_SDK_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_SDK_VENV)
	$(BIN)/uv pip sync --quiet --python $(OLDEST_SDK_VENV)/bin/python --compile-bytecode $(OLDEST_SDK_LOCK)
	touch $(OLDEST_SDK_STAMP)

# Each verifiers environment's own dependencies (its pyproject.toml's) into .venv-verifiers, under its
# lock's pins; once per environment and lock (var/verifiers/deps). A failure is the environment's:
# shown in its listing, it does not stop the install. The server does the same for a new folder.
verifiers-deps: $(STAMP) $(VERIFIERS_STAMP)
	$(BIN)/python -m server.environments.verifiers.deps

install: $(STAMP) $(ATROPOS_STAMP) $(VERIFIERS_STAMP) $(OLDEST_SDK_STAMP) verifiers-deps

# After a change to pyproject.toml's dependencies: pin everything anew (torch: its newest CPU build).
lock: | $(BIN)/uv
	$(PYTHON) scripts/torch_wheel.py --newest
	$(BIN)/uv lock
	$(BIN)/uv pip compile --quiet --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
		runners/atropos/requirements.txt -o $(ATROPOS_LOCK)
	$(BIN)/uv pip compile --quiet --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
		runners/verifiers/requirements.txt -o $(VERIFIERS_LOCK)
	$(BIN)/uv pip compile --quiet --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
		tests/tinker_api/sdk_oldest/requirements.txt -o $(OLDEST_SDK_LOCK)

serve: $(STAMP) $(ATROPOS_STAMP) $(VERIFIERS_STAMP)
	$(BIN)/python -m server

test: $(STAMP) $(ATROPOS_STAMP) $(VERIFIERS_STAMP) $(OLDEST_SDK_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MKDOCS) --strict --quiet
	$(BIN)/mypy
	$(BIN)/python -m pytest -q --durations=25

test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q --durations=25 -m 'not ($(NOT_FAST))'

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# mypy as pyproject.toml configures it: strict on core/ and server/, the default checks elsewhere.
typecheck: $(STAMP)
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The documentation site (mkdocs.yml, docs/) into site/; offline, nothing fetched.
docs: $(STAMP)
	$(MKDOCS) --strict

clean:
	rm -rf $(VENV) $(ATROPOS_VENV) $(VERIFIERS_VENV) $(OLDEST_SDK_VENV) var site wheels

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# Learning curves (benchmarks/README.md): the losses and advantage modes (about 40 minutes on
# 2 CPU cores), then the algorithm knobs (sampling ahead, KL, GSPO, distillation; about 45).
curves: $(STAMP)
	$(SYNC) --extra bench
	$(BIN)/python -m benchmarks.learning
	$(BIN)/python -m benchmarks.algorithms
