# Two commands on a fresh machine: `make run` and `make test`. Both create .venv if missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.stitchrec-installed
PYTEST_ARGS ?= -n 2 --dist worksteal --durations=15

.PHONY: run test lint format install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/stitchrec demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache

# Regenerates the committed protos/*_pb2.py and *_pb2_grpc.py after a .proto file changes.
.PHONY: protos
protos: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. protos/*.proto
