# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test venv lint typecheck bench clean

# every compiled part and header: a change to any of them (or a new one) rebuilds the extensions
C_SOURCES := $(sort $(wildcard src/shardfeed/*/*.[ch] src/shardfeed/*/*/*.[ch]))
BUILT  := $(VENV)/.built

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch is pinned to the CPU build available on every machine of this project
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev,torch,jax,s3,obstore,demo,nvimgcodec,tensorflow,keras]"
	touch $(STAMP)

$(BUILT): $(STAMP) $(C_SOURCES)
	$(PY) setup.py --quiet build_ext --inplace
	touch $(BUILT)

venv: $(BUILT)

demo: $(BUILT)
	$(VENV)/bin/shardfeed demo --out demo-out

# The suite waits on servers, subprocesses and deadlines as much as it computes: three test
# processes on 2 cores run it in about 6 minutes, against 10.5 in one. A test file's tests
# stay in one process (its module's fixtures, a local Ray, are made once). TEST_PROCESSES=0
# runs it in this process (a debugger, -x).
TEST_PROCESSES ?= 3

test: $(BUILT)
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_PROCESSES) --dist loadfile

lint: $(BUILT)
	$(VENV)/bin/ruff check src tests bench

typecheck: $(BUILT)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) demo-out build *.egg-info src/*.egg-info
