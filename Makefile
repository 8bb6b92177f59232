# Two entry points, each bootstraps .venv idempotently:
#   make demo   convert/emulate a model on a real image, write the annotated PNG and the report
#   make test        run the whole test suite (slow tests included)
#   make test-fast   the suite without the tests marked slow (< 2 minutes)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-deps -r requirements.lock   # the lock is complete; tf-keras names tensorflow, tensorflow-cpu serves it
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m tl2k210.k210.emulator.warm      # compile the emulator's numba kernels once (~45 s)
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m tl2k210.demo --out out/demo

# --dist loadgroup: tests sharing a module fixture run on one worker (tests/conftest.py); three
# workers on two cores: the REPL, flash and fault tests wait on line timeouts, a third keeps a core busy
# (this VM: 540-542 s with -n 3, 558-610 s with -n 2); the 30 slowest tests listed at the end
PYTEST := $(PY) -m pytest -q -n 3 --dist loadgroup --durations=30

test: $(STAMP)
	$(PYTEST) tests

test-fast: $(STAMP)
	$(PYTEST) -m "not slow" tests

bench: $(STAMP)
	$(PY) bench/emulator.py
	$(PY) bench/inspect_startup.py

clean:
	rm -rf out .pytest_cache
