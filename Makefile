# LayerLens: two commands from a fresh clone.
#   make run    create .venv if missing, install what is needed, start the dashboard on the demo model
#   make dev    the same, watching the source files: an edit reloads the page (the file watcher is off otherwise)
#   make test   the same environment plus the test tools, then the test suite without the slow tests
#   make test-all  every test, the slow ones too (real processes, the browser, whole-file checks): what CI runs;
#                  the slow ones in JOBS=3 processes of one test file each (JOBS=0: in this one); three on two
#                  cores, as the slow tests also wait on servers, jobs and the browser (figures in the README)
#   `make install` also puts the `layerlens` command in .venv/bin (an editable install of this clone)
# Installing is skipped when requirements*.txt and constraints.txt have not changed since the last install
# (a stamp file in .venv). Switches:
#   TORCH=cpu        the CPU-only torch build (from PyTorch's CPU index) instead of the platform's default wheel
#   CONSTRAINTS=     install without the pinned versions in constraints.txt (the ones CI tested)
#   PYTHON=python3.12  the interpreter that creates .venv (3.10 or newer)

PYTHON ?= python3
VENV ?= .venv
TORCH ?=
CONSTRAINTS ?= constraints.txt
PORT ?= 8501
JOBS ?= 3
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# uv installs the same pinned versions as pip, in half the time here, and compiles the bytecode at install as pip
# does. It reads none of pip's configuration: pip's find-links (PIP_FIND_LINKS or pip.conf) are passed on.
FIND_LINKS = $(shell $(PIP) config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$$/\1/p" | tr ' ' '\n' | sort -u)
UV = $(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode $(foreach f,$(FIND_LINKS),--find-links $(f))
PIN := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
TORCH_INDEX := $(if $(filter cpu,$(TORCH)),--index-url https://download.pytorch.org/whl/cpu)

.PHONY: run dev test test-all install install-deps install-dev lock clean

run: $(VENV)/.installed
	$(BIN)/layerlens dashboard --port $(PORT)

dev: $(VENV)/.installed
	$(BIN)/layerlens dashboard --port $(PORT) --dev

test: $(VENV)/.installed-dev
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest -q -m "not slow"

test-all: $(VENV)/.installed-dev
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest -q -m "not slow"
	$(BIN)/python -m pytest -q -m slow -n $(JOBS) --dist loadfile

install: $(VENV)/.installed
install-deps: $(VENV)/.deps
install-dev: $(VENV)/.installed-dev

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10) and "LayerLens needs Python 3.10 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(PIN) uv

# torch first, on its own: the platform's default wheel (CUDA on Linux, MPS-capable on macOS), or TORCH=cpu
$(VENV)/.deps: $(BIN)/python requirements.txt $(wildcard $(CONSTRAINTS))
	$(UV) $(PIN) $(TORCH_INDEX) torch
	$(UV) $(PIN) -r requirements.txt
	touch $@

# LayerLens itself, editable and without re-resolving its dependencies: puts the `layerlens` command in $(BIN)
$(VENV)/.installed: $(VENV)/.deps pyproject.toml
	$(UV) --no-deps -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt requirements-atlas.txt
	$(UV) $(PIN) -r requirements-dev.txt
	touch $@

# constraints.txt: the versions a fresh install resolved (and CI then tested), torch without its local tag
lock: $(VENV)/.installed-dev
	$(PIP) freeze --exclude-editable | grep -v '^-e' | sed -E 's/^(torch==[^+]*)\+.*/\1/' > constraints.txt

clean:
	rm -rf $(VENV)
