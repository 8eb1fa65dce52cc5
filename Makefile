# The README's two commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint pytest ansible-checks clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/clusterctl demo

test: $(STAMP) lint ansible-checks pytest

lint: $(STAMP)
	$(BIN)/ruff check .

ansible-checks: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH bash tests/ansible_checks.sh

pytest: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
