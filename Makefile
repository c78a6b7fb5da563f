# The commands of the README: `make lab` (JupyterLab on the labs), `make book` (build the website) and
# `make test` (every test). Each creates .venv on first use. TORCH selects the PyTorch build that is installed into it:
#   make test                                   # torch==2.13.0 (this project's CPU build)
#   make test TORCH="torch --index-url https://download.pytorch.org/whl/cpu"     # CPU wheel from pytorch.org
#   make test TORCH="torch --index-url https://download.pytorch.org/whl/cu124"   # a CUDA build

SHELL := /bin/bash
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: book test venv lab lint format sync labs check-python bench bench-long ablate browser clean lock

check-python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: '$(PYTHON)' was not found. Install Python 3.10 or newer, or run: make PYTHON=/path/to/python3.x"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || { echo "error: the course needs Python 3.10 or newer, but '$(PYTHON)' is $$($(PYTHON) -V 2>&1). Run: make PYTHON=/path/to/python3.10-or-newer"; exit 1; }

# constraints.txt pins what `make test` last passed with (scripts/lock.py), for the Python it names;
# another Python installs the newest versions that requirements.txt allows, with a note.
LOCK_PYTHON := $(shell sed -n 's/^\# python: //p' constraints.txt 2>/dev/null)

# Installing goes through uv (from PyPI, into the venv): several times faster than pip. Like pip, it
# compiles the bytecode (where PYTHONDONTWRITEBYTECODE is set, every import would otherwise compile it
# again). Should uv fail, pip does the same install. uv reads neither pip's configuration nor
# PIP_FIND_LINKS, so the folders pip is told to find wheels in (a machine's own torch build) are passed on.
# PIP_LINKS asks pip once, when first used, and keeps the answer (it replaces its own definition).
PIP_LINKS = $(eval PIP_LINKS := $(sort $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null) $(PIP_FIND_LINKS)))$(PIP_LINKS)
INSTALL = $(BIN)/python -m uv pip install --quiet --compile-bytecode --python $(BIN)/python $(PIP_LINKS:%=--find-links %)

$(STAMP): requirements.txt pyproject.toml constraints.txt | check-python
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv
	$(INSTALL) $(TORCH) || $(BIN)/python -m pip install --quiet $(TORCH)
	@if [ "$$($(BIN)/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" = "$(LOCK_PYTHON)" ]; then \
	  echo "$(INSTALL) -r requirements.txt -e .[bench] -c constraints.txt"; \
	  $(INSTALL) -r requirements.txt -e ".[bench]" -c constraints.txt \
	  || $(BIN)/python -m pip install --quiet -r requirements.txt -e ".[bench]" -c constraints.txt; \
	else echo "note: constraints.txt is for Python $(LOCK_PYTHON); installing the newest allowed versions"; \
	  $(INSTALL) -r requirements.txt -e ".[bench]" || $(BIN)/python -m pip install --quiet -r requirements.txt -e ".[bench]"; fi
	@touch $@

venv: $(STAMP)  ## create .venv with everything the book and the tests need

book: $(STAMP)  ## build the website into _build/html (strict: warnings are errors; pages run side by side)
	$(BIN)/python scripts/build_book.py
	@echo "The website is at: $(abspath _build/html/index.html)"

LAB_ARGS ?=

lab: $(STAMP)  ## JupyterLab on the labs and the chapter pages (they open as notebooks); e.g. LAB_ARGS="--port 9999 --no-browser"
	$(BIN)/python scripts/lab.py $(LAB_ARGS)

browser:  ## Debian's chromium for the site tests: installed only when missing and running as root
	@if [ -x "$${CHROMIUM:-/usr/bin/chromium}" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's chromium for the site tests (apt-get install chromium)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "note: no chromium found; the site tests will be skipped (sudo apt-get install chromium)"; fi

# The tests run on every core (scripts/run_tests.py): the strict book build (pages executed side by side)
# beside the package tests, then the labs under nbval, and the site tests once the book is built. Each
# job's output is in _build/test-logs/; one line per job is printed, and the log of any that failed.
test: $(STAMP) browser  ## lint, package tests, strict book build, site checks, labs under nbval
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/sync_labs.py --check
	$(BIN)/actionlint
	$(BIN)/python scripts/run_tests.py

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

sync: $(STAMP)  ## regenerate every lab's Colab badge and setup cell from pyproject.toml's URL
	$(BIN)/python scripts/sync_labs.py

labs: $(STAMP)  ## regenerate the labs' head cells and re-execute them, storing outputs
	$(BIN)/python scripts/sync_labs.py --execute

BENCHES := attention decode lm seq2seq vit_digits mlm bpe
BENCH_DEVICE ?= cpu

bench: $(STAMP)  ## run every benchmark; results go to bench/results/<device>/<name>.json for the book
	@mkdir -p bench/results/$(BENCH_DEVICE)
	@set -o pipefail; for b in $(BENCHES); do echo "== bench/$$b.py --device $(BENCH_DEVICE)"; \
	  $(BIN)/python bench/$$b.py --device $(BENCH_DEVICE) | tee bench/results/$(BENCH_DEVICE)/$$b.log || exit 1; \
	  tail -n 1 bench/results/$(BENCH_DEVICE)/$$b.log > bench/results/$(BENCH_DEVICE)/$$b.json; done
	@if [ $(BENCH_DEVICE) = cpu ]; then out=bench/results/cpu/lm_minute; echo "== bench/lm.py --preset minute"; \
	  set -o pipefail; $(BIN)/python bench/lm.py --preset minute | tee $$out.log || exit 1; \
	  tail -n 1 $$out.log > $$out.json; fi

# The long studies, about 2 hours on 2 idle cores: the scaling sweep, the learning-rate sweep and the
# modern model (read by the training and extensions chapters), every claim at its large setting (claims), the position
# schemes beyond the training length (length, extensions), the masked auto-encoder against the ViT
# (mae_digits, masked models), the book's cold and warm build times, then the seeds of the scaling
# study's held-out sizes and every claim at each rate of the learning-rate grid. Results are stored
# like `make bench`'s.
LONG_BENCHES := scaling lr_sweep modern claims length mae_digits build
ARGS_claims := --setting large
# tc.claims.LR_GRID: every claim again at each rate of the grid (about 15 minutes each on 2 cores)
CLAIMS_LR_GRID = $(shell $(BIN)/python -c "import transformer_course.claims as c; print(*c.LR_GRID)")

bench-long: $(STAMP)  ## run the long studies (~2 h on 2 cores); results as for `make bench`
	@mkdir -p bench/results/$(BENCH_DEVICE)
	@set -o pipefail; for b in $(LONG_BENCHES); do \
	  args="$$( [ $$b = build ] || echo --device $(BENCH_DEVICE)) $$( [ $$b = claims ] && echo $(ARGS_claims))"; \
	  echo "== bench/$$b.py $$args"; \
	  $(BIN)/python bench/$$b.py $$args | tee bench/results/$(BENCH_DEVICE)/$$b.log || exit 1; \
	  tail -n 1 bench/results/$(BENCH_DEVICE)/$$b.log > bench/results/$(BENCH_DEVICE)/$$b.json; done
	@out=bench/results/$(BENCH_DEVICE)/scaling_noise; echo "== bench/scaling.py --noise"; \
	  $(BIN)/python bench/scaling.py --device $(BENCH_DEVICE) --noise | tee $$out.log || exit 1; \
	  tail -n 1 $$out.log > $$out.json
	@mkdir -p bench/results/$(BENCH_DEVICE)/claims-lr
	@set -o pipefail; for lr in $(CLAIMS_LR_GRID); do out=bench/results/$(BENCH_DEVICE)/claims-lr/lr$$lr; \
	  echo "== bench/claims.py --setting large --lr $$lr"; \
	  $(BIN)/python bench/claims.py --device $(BENCH_DEVICE) --setting large --lr $$lr | tee $$out.log || exit 1; \
	  tail -n 1 $$out.log > $$out.json; done

ABLATION_SEEDS := 0 1

ablate: $(STAMP)  ## the ViT recipe with each part left out (two seeds); read by the vision chapter
	@mkdir -p bench/results/$(BENCH_DEVICE)/ablations
	@set -o pipefail; for a in $$($(BIN)/python bench/vit_digits.py --list-ablations); do for s in $(ABLATION_SEEDS); do \
	  out=bench/results/$(BENCH_DEVICE)/ablations/vit_digits-$$a-seed$$s; echo "== $$out"; \
	  $(BIN)/python bench/vit_digits.py --device $(BENCH_DEVICE) --ablate $$a --seed $$s > $$out.log || exit 1; \
	  tail -n 1 $$out.log > $$out.json; tail -n 1 $$out.log | cut -c1-160; done; done

lock: $(STAMP)  ## after `make test` passed: record the versions it passed with in constraints.txt
	$(BIN)/python scripts/lock.py

clean:
	rm -rf _build
