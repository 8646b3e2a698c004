# Two entry points, both self-installing into .venv:
#   make train [ARGS="key=value ..."]   set up and run the main job (dapo-train)
#   make test                           set up and run the tests (what CI runs)
# torch is pinned by constraints/cpu.txt in the same pip command as everything else, so pip never
# resolves a multi-GB CUDA torch on a CPU machine. On a GPU cluster use your CUDA torch and `.[gpu]`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --progress-bar off -c constraints/cpu.txt

.PHONY: setup train test bench
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py constraints/cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --progress-bar off -q -U pip
	$(PIP) -e ".[test]"
	touch $@

train: setup
	$(VENV)/bin/dapo-train $(ARGS)

test: setup
	$(PY) -m pytest -q $(ARGS)

bench: setup
	$(PIP) -e ".[test,bench]"
	$(PY) -m bench.run_all $(ARGS)
