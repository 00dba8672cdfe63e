# Two commands: `make run` and `make test`. Both set up .venv on a fresh machine first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[k8s,train,test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	@echo "the hub service arrives with issue 10; for now: $(BIN)/wmla simulate --scenario tests/scenarios/s1_shares_4_2_2.yaml --json"

test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

lint: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python benchmarks/bench_scheduler.py

clean:
	rm -rf $(VENV) build *.egg-info
