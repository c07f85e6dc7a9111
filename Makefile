# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test venv lint typecheck bench clean

$(STAMP): pyproject.toml setup.py src/shardfeed/format/_wire.c src/shardfeed/transforms/decode/_png.c \
		src/shardfeed/sampling/_draws.c src/shardfeed/pipeline/_slice.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch is pinned to the CPU build available on every machine of this project
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev,torch,jax,s3,demo,nvimgcodec,tensorflow,keras]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/shardfeed demo --out demo-out

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) demo-out build *.egg-info src/*.egg-info
