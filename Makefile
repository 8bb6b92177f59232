# Two entry points, each bootstraps .venv idempotently:
#   make demo   convert/emulate a model on a real image, write the annotated PNG and the report
#   make test   run the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m tl2k210.demo --out out/demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 tests

bench: $(STAMP)
	$(PY) bench/emulator.py
	$(PY) bench/inspect_startup.py

clean:
	rm -rf out .pytest_cache
